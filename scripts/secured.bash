# shellcheck shell=bash
# scripts/secured.bash: the secured variants of the local servers, sourced by scripts/services
# (issue 36). Each runs beside its plain sibling, on its own port, the way production runs it:
#
#   etcd-tls        TLS with client certificates (--client-cert-auth), RBAC auth on
#   postgres-tls    TLS (client certificates checked: clientcert=verify-ca), scram-sha-256
#   redis-tls       TLS only (no plain port), client certificates required, ACL users only
#   mariadb-tls     TLS required (require_secure_transport), users REQUIRE X509 (a client
#                   certificate of our CA) and a password
#   azurite-tls     Azurite's blob service over HTTPS only (no client certificates: Azure has
#                   none); the account key, and a read-only SAS (sp=rl)
#   zookeeper-auth  digest authentication; znode ACLs are the client's (creator_all)
#
# A throw-away CA and certificates are made at the first start with Debian's openssl, under
# $LEASEHOLD_SERVICES_DIR/pki (LEASEHOLD_PKI_DIR):
#   ca.pem              the CA that signed everything below
#   other-ca.pem        a CA that signed nothing here: "wrong CA"
#   server.pem/.key     the servers' certificate, valid for IP 127.0.0.1 only. Every secured
#                       server also listens on 127.0.0.2, where that certificate is the
#                       "wrong host" one.
#   client.pem/.key     a client certificate (CN leasehold-client)
#   expired.pem/.key    a client certificate that expired in 2020
# Passwords are random, made once per service directory, and reach tests through the env file
# (LEASEHOLD_*_URL carries them; LEASEHOLD_*_PASSWORD names them for the secret scans).
#
# Users and roles (the least privilege of each backend's docs):
#   etcd:      user `leasehold` with role `leasehold-rw` (readwrite on the prefix
#              `leasehold-tests/`), user `leasehold-ro` with role `leasehold-ro` (read on it),
#              `root` for the set-up only.
#   postgres:  role `leasehold` (LOGIN, owner of schema `leasehold` in database `leasehold`,
#              no CREATEDB, no superuser), role `leasehold_ro` (SELECT on its tables).
#   redis:     user `leasehold` (the keys, channels and commands of crates/leasehold-redis's
#              docs), user `leasehold-ro` (read-only commands on the same keys), `admin` for
#              probes; the default user is off.
#   mariadb:   user `leasehold` (SELECT, INSERT, UPDATE, DELETE, CREATE on database `leasehold`:
#              crates/leasehold-mysql/docs.md), user `leasehold_ro` (SELECT on it); root only
#              over the unix socket, for the set-up.
#   azure:     the emulator's account key (everything); an account SAS with sp=rl (read, list).
#   zookeeper: any client may connect; a store with ?auth=digest:user:pass creates its znodes
#              with creator_all ACLs, so another digest user cannot delete them.

ETCD_TLS_PORT=$((22389 + OFFSET))
ETCD_TLS_PEER_PORT=$((22390 + OFFSET))
PG_TLS_PORT=$((25442 + OFFSET))
REDIS_TLS_PORT=$((24389 + OFFSET))
ZK_AUTH_PORT=$((22191 + OFFSET))
MARIADB_TLS_PORT=$((23316 + OFFSET))
AZURITE_TLS_PORT=$((21010 + OFFSET))
PKI_DIR="$SERVICES_DIR/pki"

SECURED_SERVICES=(etcd-tls postgres-tls redis-tls mariadb-tls azurite-tls zookeeper-auth)

# --- certificates ----------------------------------------------------------------------------

pki_sign() { # NAME CN SAN EXTENDED_KEY_USAGE [START END]: NAME.pem, NAME.key signed by ca
	local name=$1 cn=$2 san=$3 eku=$4 start=${5:-} end=${6:-} dates=(-days 3650)
	[[ -n $start ]] && dates=(-startdate "$start" -enddate "$end")
	openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$PKI_DIR/$name.key" \
		-out "$PKI_DIR/$name.csr" -subj "/CN=$cn" -addext "subjectAltName=$san" \
		-addext "extendedKeyUsage=$eku" -addext "basicConstraints=critical,CA:FALSE" \
		-addext "keyUsage=critical,digitalSignature,keyEncipherment" 2>/dev/null
	openssl ca -batch -config "$PKI_DIR/ca.cnf" -cert "$PKI_DIR/ca.pem" -keyfile "$PKI_DIR/ca.key" \
		-in "$PKI_DIR/$name.csr" -out "$PKI_DIR/$name.pem" -notext "${dates[@]}" 2>/dev/null
	rm -f "$PKI_DIR/$name.csr"
}

ensure_pki() {
	[[ -s $PKI_DIR/expired.pem ]] && return 0
	ensure_apt openssl
	rm -rf "$PKI_DIR"
	mkdir -p "$PKI_DIR/db"
	: >"$PKI_DIR/db/index"
	echo 01 >"$PKI_DIR/db/serial"
	cat >"$PKI_DIR/ca.cnf" <<-EOF
		[ca]
		default_ca = local
		[local]
		database = $PKI_DIR/db/index
		new_certs_dir = $PKI_DIR/db
		serial = $PKI_DIR/db/serial
		default_md = sha256
		policy = any
		copy_extensions = copy
		unique_subject = no
		[any]
		commonName = supplied
	EOF
	local ca
	for ca in ca other-ca; do
		openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
			-keyout "$PKI_DIR/$ca.key" -out "$PKI_DIR/$ca.pem" -subj "/CN=leasehold test $ca" \
			-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
	done
	pki_sign server leasehold-server IP:127.0.0.1 serverAuth,clientAuth
	pki_sign client leasehold-client DNS:leasehold-client clientAuth
	pki_sign expired leasehold-client DNS:leasehold-client clientAuth 20200101000000Z 20200102000000Z
	chmod 644 "$PKI_DIR"/*.pem
	chmod 600 "$PKI_DIR"/*.key # libpq refuses a key others may read
	log "made a throw-away CA and certificates in $PKI_DIR"
}

# A random password with characters that must be escaped in a URL ('@' as %40, '/' as %2F).
secret_for() { # DIR NAME: prints the password kept in DIR/NAME.password (made once)
	local f="$1/$2.password"
	[[ -s $f ]] || printf 'p@ss/%s' "$(openssl rand -hex 12)" >"$f"
	cat "$f"
}
url_escape() { local s=${1//@/%40}; echo "${s//\//%2F}"; }

pki_env() {
	cat <<-EOF
		LEASEHOLD_PKI_DIR=$PKI_DIR
	EOF
}

# users_fragment DIR NAME URL READONLY_URL PASSWORD PID_FILE LOG: the env fragment of a secured
# service with the store's user and a read-only one: LEASEHOLD_<NAME>_{URL,READONLY_URL,PASSWORD,
# PID_FILE,LOG} and the PKI directory.
users_fragment() {
	write_fragment "$1" <<-EOF
		$(pki_env)
		LEASEHOLD_$2_URL=$3
		LEASEHOLD_$2_READONLY_URL=$4
		LEASEHOLD_$2_PASSWORD=$5
		LEASEHOLD_$2_PID_FILE=$6
		LEASEHOLD_$2_LOG=$7
	EOF
}

# --- etcd-tls --------------------------------------------------------------------------------

etcd_tls_ctl() { # etcdctl as root over TLS with the client certificate
	ETCDCTL_API=3 etcdctl --endpoints="https://127.0.0.1:$ETCD_TLS_PORT" --dial-timeout=2s --command-timeout=5s \
		--cacert "$PKI_DIR/ca.pem" --cert "$PKI_DIR/client.pem" --key "$PKI_DIR/client.key" "$@"
}
etcd_tls_health() { etcd_tls_ctl endpoint health >/dev/null 2>&1 || etcd_tls_ctl --user "root:$(cat "$SERVICES_DIR/etcd-tls/root.password")" endpoint health >/dev/null 2>&1; }

up_etcd-tls() {
	local dir="$SERVICES_DIR/etcd-tls" t pw ro root
	mkdir -p "$dir"
	t=$(now_ms)
	[[ -s $PKI_DIR/expired.pem ]] || die "no certificates in $PKI_DIR (made by install_for)"
	pw=$(secret_for "$dir" leasehold)
	ro=$(secret_for "$dir" leasehold-ro)
	root=$(secret_for "$dir" root)
	if pid_alive "$dir/etcd.pid" "$dir"; then
		log "etcd-tls already running (pid $(pid_of "$dir/etcd.pid"))"
	else
		require_free_port etcd-tls "$ETCD_TLS_PORT" "$ETCD_TLS_PEER_PORT"
		rm -rf "$dir/data" # users and roles are made afresh below
		launch "$dir" "$dir/etcd.pid" "$dir/etcd.log" etcd \
			--name leasehold-tls --data-dir "$dir/data" \
			--listen-client-urls "https://127.0.0.1:$ETCD_TLS_PORT,https://127.0.0.2:$ETCD_TLS_PORT" \
			--advertise-client-urls "https://127.0.0.1:$ETCD_TLS_PORT" \
			--listen-peer-urls "http://127.0.0.1:$ETCD_TLS_PEER_PORT" \
			--initial-advertise-peer-urls "http://127.0.0.1:$ETCD_TLS_PEER_PORT" \
			--initial-cluster "leasehold-tls=http://127.0.0.1:$ETCD_TLS_PEER_PORT" \
			--initial-cluster-token leasehold-tls --initial-cluster-state new \
			--cert-file "$PKI_DIR/server.pem" --key-file "$PKI_DIR/server.key" \
			--trusted-ca-file "$PKI_DIR/ca.pem" --client-cert-auth \
			--unsafe-no-fsync --logger zap --log-outputs stderr
	fi
	wait_ready etcd-tls "$dir/etcd.log" "$dir/etcd.pid" "$dir" etcd_tls_health || {
		down_etcd-tls
		return 1
	}
	if ! etcd_tls_ctl --user "root:$root" role get leasehold-rw >/dev/null 2>&1; then # auth not set up yet
		{
			etcd_tls_ctl user add root --new-user-password="$root" --interactive=false
			etcd_tls_ctl user grant-role root root
			etcd_tls_ctl role add leasehold-rw
			etcd_tls_ctl role grant-permission leasehold-rw --prefix=true readwrite leasehold-tests/
			etcd_tls_ctl user add leasehold --new-user-password="$pw" --interactive=false
			etcd_tls_ctl user grant-role leasehold leasehold-rw
			etcd_tls_ctl role add leasehold-ro
			etcd_tls_ctl role grant-permission leasehold-ro --prefix=true read leasehold-tests/
			etcd_tls_ctl user add leasehold-ro --new-user-password="$ro" --interactive=false
			etcd_tls_ctl user grant-role leasehold-ro leasehold-ro
			etcd_tls_ctl auth enable
		} >/dev/null || die "etcd-tls: setting up users and roles failed"
	fi
	log "etcd-tls ready on 127.0.0.1:$ETCD_TLS_PORT in $(secs_since "$t") s"
	local tls="ca=$PKI_DIR/ca.pem&cert=$PKI_DIR/client.pem&key=$PKI_DIR/client.key"
	users_fragment "$dir" ETCD_TLS \
		"etcds://leasehold:$(url_escape "$pw")@127.0.0.1:$ETCD_TLS_PORT/leasehold-tests?$tls" \
		"etcds://leasehold-ro:$(url_escape "$ro")@127.0.0.1:$ETCD_TLS_PORT/leasehold-tests?$tls" \
		"$pw" "$dir/etcd.pid" "$dir/etcd.log"
}
down_etcd-tls() {
	stop_pid etcd-tls "$SERVICES_DIR/etcd-tls/etcd.pid" "$SERVICES_DIR/etcd-tls"
	rm -f "$SERVICES_DIR/etcd-tls/env"
}
status_etcd-tls() {
	status_line etcd-tls "$SERVICES_DIR/etcd-tls/etcd.pid" "$SERVICES_DIR/etcd-tls" \
		"127.0.0.1:$ETCD_TLS_PORT" etcd_tls_health
}

# --- postgres-tls ----------------------------------------------------------------------------
# A second cluster. Local (unix socket) connections are trusted, for the set-up; TCP ones must
# speak TLS, show a client certificate of our CA and log in with scram-sha-256.

as_pg_tls() { (cd "$SERVICES_DIR/postgres-tls" && runuser -u postgres -- "$@"); }

up_postgres-tls() {
	local dir="$SERVICES_DIR/postgres-tls" bin t pw ro
	local data="$dir/data" logfile="$dir/postgres.log" pidfile="$dir/data/postmaster.pid"
	bin=$(pg_bin)
	mkdir -p "$dir"
	[[ -s $PKI_DIR/expired.pem ]] || die "no certificates in $PKI_DIR (made by install_for)"
	pw=$(secret_for "$dir" leasehold)
	ro=$(secret_for "$dir" leasehold_ro)
	touch "$logfile"
	chown postgres:postgres "$dir" "$logfile"
	t=$(now_ms)
	if pid_alive "$pidfile" "$data"; then
		log "postgres-tls already running (pid $(pid_of "$pidfile"))"
	else
		require_free_port postgres-tls "$PG_TLS_PORT"
		if [[ ! -s $data/PG_VERSION ]]; then
			rm -rf "$data"
			as_pg_tls "$bin/initdb" -D "$data" -U postgres --auth-local=trust --auth-host=reject \
				--encoding=UTF8 --locale=C --no-sync --no-instructions >>"$logfile" 2>&1 ||
				die "postgres-tls: initdb failed"
			echo "include_if_exists = 'leasehold.conf'" >>"$data/postgresql.conf"
		fi
		install -o postgres -g postgres -m 600 "$PKI_DIR/server.key" "$data/server.key"
		install -o postgres -g postgres -m 644 "$PKI_DIR/server.pem" "$data/server.pem"
		install -o postgres -g postgres -m 644 "$PKI_DIR/ca.pem" "$data/ca.pem"
		cat >"$data/pg_hba.conf" <<-EOF
			local all all trust
			hostssl all all 127.0.0.1/32 scram-sha-256 clientcert=verify-ca
			hostssl all all 127.0.0.2/32 scram-sha-256 clientcert=verify-ca
		EOF
		cat >"$data/leasehold.conf" <<-EOF
			listen_addresses = '127.0.0.1,127.0.0.2'
			port = $PG_TLS_PORT
			unix_socket_directories = '$data'
			max_connections = 200
			fsync = off
			synchronous_commit = off
			full_page_writes = off
			logging_collector = off
			password_encryption = 'scram-sha-256'
			ssl = on
			ssl_cert_file = 'server.pem'
			ssl_key_file = 'server.key'
			ssl_ca_file = 'ca.pem'
		EOF
		chown postgres:postgres "$data/leasehold.conf" "$data/pg_hba.conf"
		(
			close_extra_fds
			as_pg_tls "$bin/pg_ctl" -D "$data" -l "$logfile" -W start
		) </dev/null >/dev/null
	fi
	wait_ready postgres-tls "$logfile" "$pidfile" "$data" \
		"$bin/pg_isready" -q -h "$data" -p "$PG_TLS_PORT" -t 1 || {
		down_postgres-tls
		return 1
	}
	# The least privilege of crates/leasehold-postgres/docs.md: the schema is made for the role,
	# which owns it (and so may create its tables); no CREATEDB, no superuser.
	as_pg_tls "$bin/psql" -X -q -h "$data" -p "$PG_TLS_PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 \
		-v pw="$pw" -v ro="$ro" >/dev/null <<-'EOF' || die "postgres-tls: setting up roles failed"
			SELECT format('CREATE ROLE leasehold LOGIN') WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'leasehold') \gexec
			SELECT format('CREATE ROLE leasehold_ro LOGIN') WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'leasehold_ro') \gexec
			ALTER ROLE leasehold PASSWORD :'pw';
			ALTER ROLE leasehold_ro PASSWORD :'ro';
			SELECT 'CREATE DATABASE leasehold' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'leasehold') \gexec
			REVOKE ALL ON DATABASE leasehold FROM PUBLIC;
			GRANT CONNECT ON DATABASE leasehold TO leasehold, leasehold_ro;
			\c leasehold
			REVOKE CREATE ON SCHEMA public FROM PUBLIC;
			CREATE SCHEMA IF NOT EXISTS leasehold AUTHORIZATION leasehold;
			GRANT USAGE ON SCHEMA leasehold TO leasehold_ro;
			ALTER DEFAULT PRIVILEGES FOR ROLE leasehold IN SCHEMA leasehold GRANT SELECT ON TABLES TO leasehold_ro;
			GRANT SELECT ON ALL TABLES IN SCHEMA leasehold TO leasehold_ro;
		EOF
	log "postgres-tls ready on 127.0.0.1:$PG_TLS_PORT in $(secs_since "$t") s"
	local tls="sslmode=verify-full&ca=$PKI_DIR/ca.pem&cert=$PKI_DIR/client.pem&key=$PKI_DIR/client.key"
	users_fragment "$dir" POSTGRES_TLS \
		"postgres://leasehold:$(url_escape "$pw")@127.0.0.1:$PG_TLS_PORT/leasehold?$tls" \
		"postgres://leasehold_ro:$(url_escape "$ro")@127.0.0.1:$PG_TLS_PORT/leasehold?$tls" \
		"$pw" "$pidfile" "$logfile"
}
down_postgres-tls() {
	local dir="$SERVICES_DIR/postgres-tls" bin
	local data="$dir/data" pidfile="$dir/data/postmaster.pid"
	if pid_alive "$pidfile" "$data"; then
		bin=$(pg_bin)
		as_pg_tls "$bin/pg_ctl" -D "$data" -m fast -w -t 10 stop >/dev/null ||
			stop_pid postgres-tls "$pidfile" "$data"
		log "postgres-tls stopped"
	fi
	rm -f "$dir/env"
}
status_postgres-tls() {
	local bin
	bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)
	status_line postgres-tls "$SERVICES_DIR/postgres-tls/data/postmaster.pid" "$SERVICES_DIR/postgres-tls/data" \
		"127.0.0.1:$PG_TLS_PORT" "${bin:-/nonexistent}/pg_isready" -q -h "$SERVICES_DIR/postgres-tls/data" -p "$PG_TLS_PORT" -t 1
}

# --- redis-tls -------------------------------------------------------------------------------
# The ACL of user `leasehold` is exactly the list in crates/leasehold-redis/docs.md ("An ACL user
# needs ..."), for keys and channels under the prefix `leasehold-tests:`.

REDIS_LEASEHOLD_ACL='~leasehold-tests:* &leasehold-tests:* -@all +eval +evalsha +script|load +info +subscribe +unsubscribe +ping +time +type +hlen +hget +hmget +hkeys +hset +hincrby +pttl +pexpire +del +xadd +xrevrange +publish +zadd +zrem +zrange +zcard +zscore +set +get'
REDIS_READONLY_ACL='~leasehold-tests:* &leasehold-tests:* -@all +@read +ping +info +subscribe +unsubscribe'

redis_tls_cli() {
	redis-cli --tls --cacert "$PKI_DIR/ca.pem" --cert "$PKI_DIR/client.pem" --key "$PKI_DIR/client.key" \
		-h 127.0.0.1 -p "$REDIS_TLS_PORT" --user admin --pass "$(cat "$SERVICES_DIR/redis-tls/admin.password")" \
		--no-auth-warning "$@"
}
redis_tls_ping() { [[ $(redis_tls_cli ping 2>/dev/null) == PONG ]]; }

up_redis-tls() {
	local dir="$SERVICES_DIR/redis-tls" t pw ro admin
	local pidfile="$dir/redis.pid" logfile="$dir/redis.log"
	mkdir -p "$dir"
	[[ -s $PKI_DIR/expired.pem ]] || die "no certificates in $PKI_DIR (made by install_for)"
	pw=$(secret_for "$dir" leasehold)
	ro=$(secret_for "$dir" leasehold-ro)
	admin=$(secret_for "$dir" admin)
	t=$(now_ms)
	if pid_alive "$pidfile" "$dir"; then
		log "redis-tls already running (pid $(pid_of "$pidfile"))"
	else
		require_free_port redis-tls "$REDIS_TLS_PORT"
		cat >"$dir/users.acl" <<-EOF
			user default off
			user admin on >$admin ~* &* +@all
			user leasehold on >$pw $REDIS_LEASEHOLD_ACL
			user leasehold-ro on >$ro $REDIS_READONLY_ACL
		EOF
		chmod 600 "$dir/users.acl"
		launch "$dir" "$pidfile" "$logfile" redis-server \
			--bind 127.0.0.1 127.0.0.2 --port 0 --tls-port "$REDIS_TLS_PORT" \
			--tls-cert-file "$PKI_DIR/server.pem" --tls-key-file "$PKI_DIR/server.key" \
			--tls-ca-cert-file "$PKI_DIR/ca.pem" --tls-auth-clients yes \
			--aclfile "$dir/users.acl" --save '' --appendonly no --daemonize no --dir "$dir" \
			--notify-keyspace-events Ex --hz 100
	fi
	wait_ready redis-tls "$logfile" "$pidfile" "$dir" redis_tls_ping || {
		down_redis-tls
		return 1
	}
	log "redis-tls ready on 127.0.0.1:$REDIS_TLS_PORT in $(secs_since "$t") s"
	local tls="ca=$PKI_DIR/ca.pem&cert=$PKI_DIR/client.pem&key=$PKI_DIR/client.key"
	users_fragment "$dir" REDIS_TLS \
		"rediss://leasehold:$(url_escape "$pw")@127.0.0.1:$REDIS_TLS_PORT?prefix=leasehold-tests:&$tls" \
		"rediss://leasehold-ro:$(url_escape "$ro")@127.0.0.1:$REDIS_TLS_PORT?prefix=leasehold-tests:&$tls" \
		"$pw" "$pidfile" "$logfile"
}
down_redis-tls() {
	stop_pid redis-tls "$SERVICES_DIR/redis-tls/redis.pid" "$SERVICES_DIR/redis-tls"
	rm -f "$SERVICES_DIR/redis-tls/env"
}
status_redis-tls() {
	status_line redis-tls "$SERVICES_DIR/redis-tls/redis.pid" "$SERVICES_DIR/redis-tls" \
		"127.0.0.1:$REDIS_TLS_PORT" redis_tls_ping
}

# --- mariadb-tls -----------------------------------------------------------------------------
# A second MariaDB server (Debian's 10.11, run as `mysql` like the plain one): TCP clients must
# speak TLS (require_secure_transport), show a client certificate of our CA (REQUIRE X509) and
# log in with a password. Root logs in over the unix socket only (unix_socket authentication),
# for the set-up.

mariadb_tls_sql() { # PASSWORD READONLY_PASSWORD: the database and the two users, idempotent
	# The passwords come from secret_for: no quote or backslash to escape in SQL.
	local pw=$1 ro=$2
	cat <<-EOF
		CREATE DATABASE IF NOT EXISTS leasehold;
		CREATE USER IF NOT EXISTS 'leasehold'@'127.0.0.%';
		ALTER USER 'leasehold'@'127.0.0.%' IDENTIFIED BY '$pw' REQUIRE X509;
		GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON leasehold.* TO 'leasehold'@'127.0.0.%';
		CREATE USER IF NOT EXISTS 'leasehold_ro'@'127.0.0.%';
		ALTER USER 'leasehold_ro'@'127.0.0.%' IDENTIFIED BY '$ro' REQUIRE X509;
		GRANT SELECT ON leasehold.* TO 'leasehold_ro'@'127.0.0.%';
	EOF
}

up_mariadb-tls() {
	local dir="$SERVICES_DIR/mariadb-tls" t pw ro
	local pidfile="$dir/mariadb.pid" logfile="$dir/mariadb.log" sock="$dir/mariadb.sock"
	mkdir -p "$dir"
	[[ -s $PKI_DIR/expired.pem ]] || die "no certificates in $PKI_DIR (made by install_for)"
	pw=$(secret_for "$dir" leasehold)
	ro=$(secret_for "$dir" leasehold_ro)
	touch "$logfile"
	chown mysql:mysql "$dir" "$logfile"
	t=$(now_ms)
	if pid_alive "$pidfile" "$dir"; then
		log "mariadb-tls already running (pid $(pid_of "$pidfile"))"
	else
		install -o mysql -g mysql -m 600 "$PKI_DIR/server.key" "$dir/server.key"
		install -o mysql -g mysql -m 644 "$PKI_DIR/server.pem" "$dir/server.pem"
		install -o mysql -g mysql -m 644 "$PKI_DIR/ca.pem" "$dir/ca.pem"
		mariadb_launch mariadb-tls "$dir" "$MARIADB_TLS_PORT" 127.0.0.1,127.0.0.2 \
			--ssl-cert="$dir/server.pem" --ssl-key="$dir/server.key" --ssl-ca="$dir/ca.pem" \
			--require-secure-transport=ON --max-connections=400 --innodb-buffer-pool-size=32M
	fi
	wait_ready mariadb-tls "$logfile" "$pidfile" "$dir" mariadb_ping "$sock" || {
		down_mariadb-tls
		return 1
	}
	mariadb_tls_sql "$pw" "$ro" | mariadb --no-defaults --socket="$sock" -u root ||
		die "mariadb-tls: setting up the database and users failed"
	log "mariadb-tls ready on 127.0.0.1:$MARIADB_TLS_PORT in $(secs_since "$t") s"
	local tls="ssl-mode=VERIFY_IDENTITY&ca=$PKI_DIR/ca.pem&cert=$PKI_DIR/client.pem&key=$PKI_DIR/client.key"
	users_fragment "$dir" MYSQL_TLS \
		"mysql://leasehold:$(url_escape "$pw")@127.0.0.1:$MARIADB_TLS_PORT/leasehold?$tls" \
		"mysql://leasehold_ro:$(url_escape "$ro")@127.0.0.1:$MARIADB_TLS_PORT/leasehold?$tls" \
		"$pw" "$pidfile" "$logfile"
}
down_mariadb-tls() {
	stop_pid mariadb-tls "$SERVICES_DIR/mariadb-tls/mariadb.pid" "$SERVICES_DIR/mariadb-tls"
	rm -f "$SERVICES_DIR/mariadb-tls/env"
}
status_mariadb-tls() {
	status_line mariadb-tls "$SERVICES_DIR/mariadb-tls/mariadb.pid" "$SERVICES_DIR/mariadb-tls" \
		"127.0.0.1:$MARIADB_TLS_PORT" mariadb_ping "$SERVICES_DIR/mariadb-tls/mariadb.sock"
}

# --- azurite-tls -----------------------------------------------------------------------------
# Azurite's blob service with --cert/--key: HTTPS only, the server certificate of our CA. Like
# the plain one in memory, with the emulator's published account key.

https_answers() { # PORT: any HTTP status over TLS verified with our CA
	local code
	code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 --cacert "$PKI_DIR/ca.pem" "https://127.0.0.1:$1/") || true
	[[ $code =~ ^[1-5][0-9][0-9]$ ]]
}

# An account SAS as crates/leasehold-azure/src/sas.rs signs one (version 2021-08-06), with the
# permissions PERM, valid until 2099: string-to-sign = account, sp, ss, srt, st, se, sip, spr,
# sv, ses, "" (newline-joined), HMAC-SHA256 with the base64-decoded account key.
azure_account_sas() { # PERM: prints the SAS query
	local perm=$1 expiry=2099-01-01T00:00:00Z hexkey sig
	hexkey=$(printf %s "$AZURITE_KEY" | base64 -d | od -An -v -tx1 | tr -d ' \n')
	sig=$(printf '%s\n%s\nb\nsco\n\n%s\n\nhttps,http\n2021-08-06\n\n' "$AZURITE_ACCOUNT" "$perm" "$expiry" |
		openssl dgst -sha256 -mac HMAC -macopt "hexkey:$hexkey" -binary | openssl base64 -A)
	sig=${sig//+/%2B}
	sig=${sig//\//%2F}
	sig=${sig//=/%3D}
	echo "sv=2021-08-06&ss=b&srt=sco&sp=$perm&se=${expiry//:/%3A}&spr=https%2Chttp&sig=$sig"
}

up_azurite-tls() {
	local dir="$SERVICES_DIR/azurite-tls" t
	mkdir -p "$dir"
	[[ -s $PKI_DIR/expired.pem ]] || die "no certificates in $PKI_DIR (made by install_for)"
	t=$(now_ms)
	if pid_alive "$dir/azurite.pid" "$dir"; then
		log "azurite-tls already running (pid $(pid_of "$dir/azurite.pid"))"
	else
		require_free_port azurite-tls "$AZURITE_TLS_PORT"
		launch "$dir" "$dir/azurite.pid" "$dir/azurite.log" \
			env "NODE_OPTIONS=--require $ROOT/scripts/azurite-no-gc.js" "$NPM_DIR/node_modules/.bin/azurite-blob" \
			--blobHost 127.0.0.1 --blobPort "$AZURITE_TLS_PORT" --inMemoryPersistence --disableTelemetry \
			--skipApiVersionCheck --silent --cert "$PKI_DIR/server.pem" --key "$PKI_DIR/server.key"
	fi
	wait_ready azurite-tls "$dir/azurite.log" "$dir/azurite.pid" "$dir" https_answers "$AZURITE_TLS_PORT" || {
		down_azurite-tls
		return 1
	}
	log "azurite-tls ready on 127.0.0.1:$AZURITE_TLS_PORT in $(secs_since "$t") s"
	local key=${AZURITE_KEY//+/%2B}
	key=${key//\//%2F}
	key=${key//=/%3D}
	local base="https://127.0.0.1:$AZURITE_TLS_PORT/$AZURITE_ACCOUNT/leasehold-tests?ca=$PKI_DIR/ca.pem"
	users_fragment "$dir" AZURE_TLS \
		"$base&account_key=$key" \
		"$base&$(azure_account_sas rl)" \
		"$AZURITE_KEY" "$dir/azurite.pid" "$dir/azurite.log"
}
down_azurite-tls() {
	stop_pid azurite-tls "$SERVICES_DIR/azurite-tls/azurite.pid" "$SERVICES_DIR/azurite-tls"
	rm -f "$SERVICES_DIR/azurite-tls/env"
}
status_azurite-tls() {
	status_line azurite-tls "$SERVICES_DIR/azurite-tls/azurite.pid" "$SERVICES_DIR/azurite-tls" \
		"127.0.0.1:$AZURITE_TLS_PORT" https_answers "$AZURITE_TLS_PORT"
}

# --- zookeeper-auth --------------------------------------------------------------------------
# ZooKeeper 3.8 checks digest credentials on every session that adds them and enforces each
# znode's ACL; the ACL is set by whoever creates the znode. Two digest users: `leasehold` (the
# store's) and `intruder` (another client, who must not be able to delete the store's znodes).

up_zookeeper-auth() {
	local dir="$SERVICES_DIR/zookeeper-auth" t pw other
	mkdir -p "$dir"
	ensure_apt openssl
	pw=$(secret_for "$dir" leasehold)
	other=$(secret_for "$dir" intruder)
	t=$(now_ms)
	if pid_alive "$dir/zookeeper.pid" "$dir"; then
		log "zookeeper-auth already running (pid $(pid_of "$dir/zookeeper.pid"))"
	else
		require_free_port zookeeper-auth "$ZK_AUTH_PORT"
		zk_write_conf "$dir" "$ZK_AUTH_PORT"
		zk_launch "$dir"
	fi
	wait_ready zookeeper-auth "$dir/zookeeper.log" "$dir/zookeeper.pid" "$dir" zk_ready "$ZK_AUTH_PORT" || {
		down_zookeeper-auth
		return 1
	}
	# The chroot belongs to `leasehold` alone (digest ACL cdrwa, nothing for anyone else): another
	# identity (a wrong password is one) can neither read nor create under it. ZooKeeper's digest
	# is base64(sha1("user:password")).
	local digest
	digest=$(printf 'leasehold:%s' "$pw" | openssl dgst -binary -sha1 | openssl base64)
	java -Xmx64m -XX:+UseSerialGC -XX:-UsePerfData -Dlog4j.configuration="file:$dir/conf/log4j.properties" \
		-Dzookeeper.root.logger=ERROR -cp "$(zk_classpath "$dir/conf")" org.apache.zookeeper.ZooKeeperMain \
		-server "127.0.0.1:$ZK_AUTH_PORT" create /leasehold-tests "" "digest:leasehold:$digest:cdrwa" \
		>"$dir/zkcli.log" 2>&1 </dev/null || grep -q 'Node already exists' "$dir/zkcli.log" ||
		die "zookeeper-auth: cannot create /leasehold-tests (see $dir/zkcli.log)"
	log "zookeeper-auth ready on 127.0.0.1:$ZK_AUTH_PORT in $(secs_since "$t") s"
	# ZooKeeper's digest credential is user:password, so the password has no ':' (it has none).
	write_fragment "$dir" <<-EOF
		LEASEHOLD_ZOOKEEPER_AUTH_URL=zk://127.0.0.1:$ZK_AUTH_PORT/leasehold-tests?auth=digest:leasehold:$(url_escape "$pw")
		LEASEHOLD_ZOOKEEPER_AUTH_INTRUDER_URL=zk://127.0.0.1:$ZK_AUTH_PORT/leasehold-tests?auth=digest:intruder:$(url_escape "$other")
		LEASEHOLD_ZOOKEEPER_AUTH_PASSWORD=$pw
		LEASEHOLD_ZOOKEEPER_AUTH_PID_FILE=$dir/zookeeper.pid
		LEASEHOLD_ZOOKEEPER_AUTH_LOG=$dir/zookeeper.log
	EOF
}
down_zookeeper-auth() {
	stop_pid zookeeper-auth "$SERVICES_DIR/zookeeper-auth/zookeeper.pid" "$SERVICES_DIR/zookeeper-auth"
	rm -f "$SERVICES_DIR/zookeeper-auth/env"
}
status_zookeeper-auth() {
	status_line zookeeper-auth "$SERVICES_DIR/zookeeper-auth/zookeeper.pid" "$SERVICES_DIR/zookeeper-auth" \
		"127.0.0.1:$ZK_AUTH_PORT" zk_ready "$ZK_AUTH_PORT"
}
