//! Every statement leasehold sends, built once per store for its schema.
//!
//! Each lease operation is **one statement**, so that the server applies it whole or not at all
//! even when its reply is lost (a reply lost after `pg_try_advisory_lock` but before the row is
//! written would otherwise leave a lock without a holder). Statements on the lock session run
//! outside any explicit transaction, so the session is never "idle in transaction" and
//! `idle_session_timeout` always applies to it.

use std::sync::Arc;

use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, Postgres};

use crate::record::{RECORD_COLUMNS, TTL_RANGE, VALID_ROW_SQL, millis};
use crate::schema::quoted;

/// The channel of every notification leasehold sends; the payload is
/// `<schema>/<lease>/<candidate who made the change>`.
pub(crate) const CHANNEL: &str = "leasehold";

/// The channel of grant announcements: each grant sends `<schema>/<lease>` and, a line each, the
/// new term, its TTL in milliseconds, the record version and the holder (last: candidate ids
/// may hold anything but control characters). Another channel than [`CHANNEL`], so that no
/// change stream, of this version or an older one, takes a grant for a wake-up (older versions
/// do not even receive it).
pub(crate) const GRANTED_CHANNEL: &str = "leasehold_granted";

/// The channel of renewal announcements: each statement that renews grants (a renewal, a
/// relock) sends the renewed records in as few notifications as fit in Postgres's 8000-byte
/// payload, each record written as on [`GRANTED_CHANNEL`], records separated by an empty line
/// (no field is empty and none holds a newline). Another channel than grants', so that older
/// versions, which listen to grants only, receive none of them.
pub(crate) const RENEWED_CHANNEL: &str = "leasehold_renewed";

/// The line a release's notification payload ends with when its statement gave the lease's
/// lock back (written by the session's `Context::queued_payload`).
pub(crate) const QUEUED: &str = "queued";

/// The start of the line a handover's notification payload ends with, followed by the
/// successor (written by the session's `Context::handover_payload`).
pub(crate) const HANDOVER: &str = "handover:";

/// Bytes of announcement records per notification before another begins: a record is at most
/// about 500 bytes (schema 63, lease 128, holder 256, term, TTL, version), so a notification
/// stays under the server's 8000-byte payload limit.
const RENEWED_CHUNK_BYTES: usize = 7000;

/// The CTEs `lines`, `chunks` and `announced` announcing the rows of `{renewed}` (columns
/// `name`, `term`, `ttl_ms`, `version`, `holder`; `{prefix}` the `<schema>/` parameter) on
/// [`RENEWED_CHANNEL`]; `announced` yields one row per notification sent.
const ANNOUNCE_RENEWED_SQL: &str = "lines AS MATERIALIZED (
                    SELECT {prefix} || u.name || E'\\n' || u.term || E'\\n' || u.ttl_ms || E'\\n'
                           || u.version || E'\\n' || u.holder AS line
                    FROM {renewed} AS u
                 ),
                 chunks AS MATERIALIZED (
                    SELECT line, sum(octet_length(line) + 2) OVER (ORDER BY line ROWS UNBOUNDED PRECEDING)
                               / {chunk_bytes} AS chunk
                    FROM lines
                 ),
                 announced AS MATERIALIZED (
                    SELECT pg_notify('{renewed_channel}', string_agg(line, E'\\n\\n' ORDER BY line))
                    FROM chunks GROUP BY chunk
                 )";

/// The statements of one schema.
#[derive(Debug)]
pub(crate) struct Sql {
    /// `$1` lease → the record columns.
    pub(crate) read: Arc<str>,
    /// `$1` leases, `$2` their lock keys → per lease, in order: the record columns.
    pub(crate) read_many: Arc<str>,
    pub(crate) list: Arc<str>,
    pub(crate) acquire: Arc<str>,
    pub(crate) renew: Arc<str>,
    pub(crate) relock: Arc<str>,
    pub(crate) relock_many: Arc<str>,
    pub(crate) release: Arc<str>,
    pub(crate) hand_over: Arc<str>,
    pub(crate) unlock: Arc<str>,
    pub(crate) break_lease: Arc<str>,
    pub(crate) history: Arc<str>,
}

/// Whether no session of this database holds the advisory lock `{key}` (a `bigint`), as
/// `pg_locks` shows it when the statement runs (locks are not part of its snapshot).
const LOCK_FREE_SQL: &str = "NOT EXISTS (
    SELECT 1 FROM pg_locks AS pl
    WHERE pl.locktype = 'advisory' AND pl.objsubid = 1 AND pl.granted
      AND pl.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND pl.classid = (({key} >> 32) & 4294967295)::oid
      AND pl.objid = ({key} & 4294967295)::oid)";

/// A query of one of these statements. They are built from constants and a validated schema
/// name, never from a request's values (those are bound as parameters).
pub(crate) fn query<'q>(sql: &Arc<str>) -> Query<'q, Postgres, PgArguments> {
    sqlx::query(AssertSqlSafe(sql.clone()))
}

impl Sql {
    pub(crate) fn new(schema: &str) -> Sql {
        let s = quoted(schema);
        let fill = |text: &str| -> Arc<str> {
            text.replace("{announce_renewed}", ANNOUNCE_RENEWED_SQL)
                .replace("{chunk_bytes}", &RENEWED_CHUNK_BYTES.to_string())
                .replace("{renewed_channel}", RENEWED_CHANNEL)
                .replace("{record}", RECORD_COLUMNS)
                .replace("{lock_free}", LOCK_FREE_SQL)
                .replace("{valid}", VALID_ROW_SQL)
                .replace("{schema}", &s)
                .replace("{min_ttl_ms}", &millis(*TTL_RANGE.start()).to_string())
                .replace("{max_ttl_ms}", &millis(*TTL_RANGE.end()).to_string())
                .replace("{channel}", CHANNEL)
                .replace("{granted_channel}", GRANTED_CHANNEL)
                .into()
        };
        Sql {
            // $1 lease, $2 its lock key → the record columns, whether the lock is free.
            read: fill(
                "SELECT {record}, {lock_free}
                 FROM (SELECT $1::text AS name) AS w
                 LEFT JOIN {schema}.leases AS l ON l.name = w.name",
            )
            .replace("{key}", "$2::int8")
            .into(),
            // $1 leases, $2 their lock keys → per lease, in order: the record columns, whether
            // the lock is free (one snapshot for all of them).
            read_many: fill(
                "SELECT {record}, {lock_free}
                 FROM unnest($1::text[], $2::int8[]) WITH ORDINALITY AS w(name, key, i)
                 LEFT JOIN {schema}.leases AS l ON l.name = w.name
                 ORDER BY w.i",
            )
            .replace("{key}", "w.key")
            .into(),
            // $1 a LIKE pattern (escaped with `!`) → per lease row whose name matches: its name,
            // the record columns, the lock key the row records, whether that lock is free.
            list: fill(
                "SELECT w.name, {record}, l.lock_key, {lock_free}
                 FROM {schema}.leases AS l CROSS JOIN LATERAL (SELECT l.name) AS w(name)
                 WHERE l.name LIKE $1::text ESCAPE '!'",
            )
            .replace("{key}", "l.lock_key")
            .into(),
            // One row per request, each for another lease: $1 leases, $2 whether this session
            // already holds the lease's lock key, $3 the keys, $4 candidates, $5 ttl_ms, $6 new
            // versions, $7 the record version to take over (`AcquireRequest::takeover`, or
            // NULL), $8 notification payloads, $9 the TTL of the grant this session holds on the
            // lease (or NULL); $10 history limit, $11 the shortest TTL among the session's other
            // leases (0: none), $12 `<schema>/` (the prefix of grant announcements) → per request, in order: whether the lock was free, whether
            // granted, the new term, the record as it was, whether it was valid.
            //
            // Per request: takes the lock (unless already held), reads the row, grants if the
            // lock is ours and the row is absent, free, the candidate's own, or has exactly the
            // version to take over (the engine decides when a record whose holder's session ended
            // may be replaced); writes the row and the history; gives the lock back if it was
            // taken but not used; announces each grant on `GRANTED_CHANNEL` (what `inspect`
            // shows right after it). Then sets the session's idle timeout to the shortest TTL it
            // holds afterwards.
            //
            // Rows are read with the statement's snapshot, taken before the locks: a release
            // committed in between is not seen (the candidate is told Held and retries at the
            // release's notification), and every write compares the row to what was read, so a
            // stale read never grants.
            acquire: fill(
                "WITH req AS MATERIALIZED (
                    SELECT * FROM unnest($1::text[], $2::bool[], $3::int8[], $4::text[], $5::int8[],
                                         $6::text[], $7::text[], $8::text[], $9::int8[])
                        WITH ORDINALITY AS r(name, held, key, candidate, ttl_ms, version, takeover,
                                             payload, old_ttl_ms, i)
                 ),
                 lk AS MATERIALIZED (
                    SELECT r.i, CASE WHEN r.held THEN true ELSE pg_try_advisory_lock(r.key) END AS got
                    FROM req AS r
                 ),
                 cur AS MATERIALIZED (
                    SELECT r.*, lk.got, l.name IS NOT NULL AS present, l.holder AS c_holder,
                           l.term AS c_term, l.ttl_ms AS c_ttl_ms, l.version AS c_version,
                           l.previous_end AS c_previous_end,
                           (SELECT max(h.term) FROM {schema}.history AS h WHERE h.name = r.name)
                               AS history_term,
                           COALESCE({valid}, false) AS valid
                    FROM req AS r JOIN lk ON lk.i = r.i
                    LEFT JOIN {schema}.leases AS l ON l.name = r.name
                 ),
                 verdict AS MATERIALIZED (
                    SELECT c.*,
                           COALESCE(c.got
                               AND (c.history_term IS NULL OR c.history_term >= 0)
                               AND (NOT c.present OR (c.valid AND (
                                    c.c_holder IS NULL
                                    OR c.c_holder = c.candidate
                                    OR c.c_version = c.takeover))), false) AS ok,
                           greatest(c.c_term, c.history_term, 0) + 1 AS next_term
                    FROM cur AS c
                 ),
                 upd AS (
                    UPDATE {schema}.leases AS l
                    SET holder = v.candidate, term = v.next_term, ttl_ms = v.ttl_ms,
                        version = v.version, previous_end = NULL, lock_key = v.key,
                        lock_pid = pg_backend_pid(), renewed_at = now()
                    FROM verdict AS v
                    WHERE v.ok AND v.present AND l.name = v.name AND l.term = v.c_term
                      AND l.holder IS NOT DISTINCT FROM v.c_holder
                      AND l.version IS NOT DISTINCT FROM v.c_version
                    RETURNING l.name, l.term
                 ),
                 ins AS (
                    INSERT INTO {schema}.leases AS l
                        (name, holder, term, ttl_ms, version, previous_end, lock_key, lock_pid,
                         renewed_at)
                    SELECT v.name, v.candidate, v.next_term, v.ttl_ms, v.version, NULL, v.key,
                           pg_backend_pid(), now()
                    FROM verdict AS v WHERE v.ok AND NOT v.present
                    ON CONFLICT (name) DO NOTHING
                    RETURNING l.name, l.term
                 ),
                 granted AS MATERIALIZED (
                    SELECT name, term FROM upd UNION ALL SELECT name, term FROM ins
                 ),
                 ended AS (
                    UPDATE {schema}.history AS h SET ended_at = now(), end_reason = 'expired'
                    FROM verdict AS v JOIN granted AS g ON g.name = v.name
                    WHERE v.c_holder IS NOT NULL AND h.name = v.name AND h.term = v.c_term
                      AND h.ended_at IS NULL
                    RETURNING h.term
                 ),
                 began AS (
                    INSERT INTO {schema}.history (name, term, holder, acquired_at)
                    SELECT g.name, g.term, v.candidate, now()
                    FROM granted AS g JOIN verdict AS v ON v.name = g.name
                    RETURNING term
                 ),
                 pruned AS (
                    DELETE FROM {schema}.history AS h
                    USING granted AS g JOIN verdict AS v ON v.name = g.name
                    WHERE $10::int8 > 0 AND h.name = g.name AND h.term <= g.term - $10::int8
                      AND h.term IS DISTINCT FROM v.c_term
                    RETURNING h.term
                 ),
                 unlocked AS (
                    SELECT pg_advisory_unlock(v.key) FROM verdict AS v
                    WHERE v.got AND NOT v.held
                      AND NOT EXISTS (SELECT 1 FROM granted AS g WHERE g.name = v.name)
                 ),
                 notified AS (
                    SELECT pg_notify('{channel}', v.payload)
                    FROM verdict AS v JOIN granted AS g ON g.name = v.name
                    WHERE v.c_holder IS NOT NULL AND v.c_holder <> v.candidate
                 ),
                 announced AS (
                    SELECT pg_notify('{granted_channel}', $12::text || g.name || E'\n' || g.term
                        || E'\n' || v.ttl_ms || E'\n' || v.version || E'\n' || v.candidate)
                    FROM verdict AS v JOIN granted AS g ON g.name = v.name
                 ),
                 timeout AS MATERIALIZED (
                    SELECT set_config('idle_session_timeout', COALESCE(least(NULLIF($11::int8, 0),
                        (SELECT min(CASE WHEN g.name IS NOT NULL THEN v.ttl_ms ELSE v.old_ttl_ms END)
                         FROM verdict AS v LEFT JOIN granted AS g ON g.name = v.name)), 0)::text,
                        false) AS setting
                 )
                 SELECT v.i, v.got, g.term IS NOT NULL, g.term,
                        v.present, v.c_holder, v.c_term, v.c_ttl_ms, v.c_version, v.c_previous_end,
                        v.history_term, v.valid,
                        (SELECT count(*) FROM unlocked),
                        (SELECT count(*) FROM notified) + (SELECT count(*) FROM announced),
                        (SELECT count(*) FROM ended) + (SELECT count(*) FROM began)
                            + (SELECT count(*) FROM pruned),
                        (SELECT setting FROM timeout)
                 FROM verdict AS v LEFT JOIN granted AS g ON g.name = v.name
                 ORDER BY v.i",
            ),
            // $1 leases, $2 holders, $3 terms, $4 new versions, $5 lock keys, $6 `<schema>/` (the
            // prefix of announcements) → per renewed lease: its name, the notifications sent.
            // A row is renewed only if it still names the grant (not as a reservation: see
            // hand_over), was written by this session
            // (lock_pid) and pg_locks shows this session holding the lease's key. The renewed
            // records are announced on `RENEWED_CHANNEL` (what `inspect` shows right after).
            renew: fill(
                "WITH mine AS MATERIALIZED (
                    SELECT classid, objid FROM pg_locks
                    WHERE locktype = 'advisory' AND objsubid = 1 AND granted
                      AND pid = pg_backend_pid()
                 ),
                 r AS (
                    SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::text[], $5::int8[])
                        AS r(name, holder, term, version, key)
                 ),
                 upd AS (
                    UPDATE {schema}.leases AS l SET version = r.version, renewed_at = now()
                    FROM r
                    WHERE l.name = r.name AND l.holder = r.holder AND l.term = r.term
                      AND l.previous_end IS NULL AND l.lock_pid = pg_backend_pid()
                      AND EXISTS (SELECT 1 FROM mine AS m
                                  WHERE m.classid = ((r.key >> 32) & 4294967295)::oid
                                    AND m.objid = (r.key & 4294967295)::oid)
                    RETURNING l.name, l.term, l.ttl_ms, l.version, l.holder
                 ),
                 {announce_renewed}
                 SELECT u.name, (SELECT count(*) FROM announced) FROM upd AS u",
            )
            .replace("{renewed}", "upd")
            .replace("{prefix}", "$6::text")
            .into(),
            // $1 lease, $2 holder, $3 term, $4 lock key, $5 new version, $6 idle_session_timeout
            // if renewed, $7 otherwise, $8 `<schema>/` → whether it was renewed (announced on
            // `RENEWED_CHANNEL` if so).
            //
            // Renews a grant whose lock this session does not hold (its earlier session ended: a
            // reset, a reply lost mid-statement, a restarted server) by taking the lock again,
            // if the row still names the grant: nobody can have been granted the lease since,
            // or the row would name them. Waits up to lock_timeout for the lock, which a
            // contender holds for the instant of a statement that finds the lease not yet free,
            // but only while the row (as the statement's snapshot shows it) still names the
            // grant: a grant this session released or handed over, whose renewal was already
            // queued, must not wait for the lock of its successor (the session serves every
            // other lease of the store meanwhile).
            relock: fill(
                "WITH cur AS MATERIALIZED (
                    SELECT 1 FROM {schema}.leases
                    WHERE name = $1::text AND holder = $2::text AND term = $3::int8
                      AND previous_end IS NULL
                 ),
                 lk AS MATERIALIZED (SELECT pg_advisory_lock($4::int8) FROM cur),
                 upd AS (
                    UPDATE {schema}.leases
                    SET version = $5::text, lock_key = $4::int8, lock_pid = pg_backend_pid(),
                        renewed_at = now()
                    WHERE name = $1::text AND holder = $2::text AND term = $3::int8
                      AND previous_end IS NULL AND EXISTS (SELECT 1 FROM lk)
                    RETURNING name, term, ttl_ms, version, holder
                 ),
                 unlocked AS (
                    SELECT pg_advisory_unlock($4::int8) FROM lk
                    WHERE NOT EXISTS (SELECT 1 FROM upd)
                 ),
                 {announce_renewed}
                 SELECT EXISTS (SELECT 1 FROM upd), (SELECT count(*) FROM unlocked),
                        set_config('idle_session_timeout',
                                   CASE WHEN EXISTS (SELECT 1 FROM upd) THEN $6::text
                                        ELSE $7::text END, false),
                        (SELECT count(*) FROM announced)",
            )
            .replace("{renewed}", "upd")
            .replace("{prefix}", "$8::text")
            .into(),
            // $1 leases (each once), $2 holders, $3 terms, $4 lock keys, $5 new versions, $6
            // ttl_ms, $7 the shortest TTL among the session's leases (0: none), $8 `<schema>/` →
            // per grant, in order: its index, whether the lock was free, whether it was renewed,
            // the locks given back, the session's idle_session_timeout afterwards, the
            // notifications sent (the renewed records, on `RENEWED_CHANNEL`).
            //
            // `relock` for many grants at once (after a lost session, every grant of the store
            // takes its lock again), without waiting: a lock someone holds is not taken, and the
            // caller retries that grant with `relock`, which waits.
            relock_many: fill(
                "WITH r AS MATERIALIZED (
                    SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[], $5::text[],
                                         $6::int8[])
                        WITH ORDINALITY AS r(name, holder, term, key, version, ttl_ms, i)
                 ),
                 lk AS MATERIALIZED (SELECT r.i, pg_try_advisory_lock(r.key) AS got FROM r),
                 upd AS (
                    UPDATE {schema}.leases AS l
                    SET version = r.version, lock_key = r.key, lock_pid = pg_backend_pid(),
                        renewed_at = now()
                    FROM r JOIN lk ON lk.i = r.i
                    WHERE lk.got AND l.name = r.name AND l.holder = r.holder AND l.term = r.term
                      AND l.previous_end IS NULL
                    RETURNING r.i, r.ttl_ms, l.name, l.term, l.version, l.holder
                 ),
                 {announce_renewed},
                 unlocked AS (
                    SELECT pg_advisory_unlock(r.key) FROM r JOIN lk ON lk.i = r.i
                    WHERE lk.got AND NOT EXISTS (SELECT 1 FROM upd WHERE upd.i = r.i)
                 ),
                 timeout AS MATERIALIZED (
                    SELECT set_config('idle_session_timeout',
                        COALESCE(least(NULLIF($7::int8, 0), (SELECT min(ttl_ms) FROM upd)), 0)::text,
                        false) AS setting
                 )
                 SELECT r.i, lk.got, EXISTS (SELECT 1 FROM upd WHERE upd.i = r.i),
                        (SELECT count(*) FROM unlocked), (SELECT setting FROM timeout),
                        (SELECT count(*) FROM announced)
                 FROM r JOIN lk ON lk.i = r.i
                 ORDER BY r.i",
            )
            .replace("{renewed}", "upd")
            .replace("{prefix}", "$8::text")
            .into(),
            // $1 lease, $2 holder, $3 term, $4 end reason, $5 notification payload, $6 lock key,
            // $7 whether to unlock it, $8 idle_session_timeout afterwards.
            //
            // The unlock happens before the statement commits: a contender that takes the lock
            // in that instant still reads the old row, is told Held, and retries at the
            // notification, which is delivered on commit.
            release: fill(
                "WITH rel AS (
                    UPDATE {schema}.leases
                    SET holder = NULL, ttl_ms = NULL, version = NULL, lock_pid = NULL,
                        previous_end = $4::text
                    WHERE name = $1::text AND holder = $2::text AND term = $3::int8
                      AND previous_end IS NULL
                    RETURNING term
                 ),
                 ended AS (
                    UPDATE {schema}.history AS h SET ended_at = now(), end_reason = $4::text
                    FROM rel
                    WHERE h.name = $1::text AND h.term = rel.term AND h.ended_at IS NULL
                    RETURNING h.term
                 ),
                 notified AS (SELECT pg_notify('{channel}', $5::text) FROM rel),
                 unlocked AS (SELECT pg_advisory_unlock($6::int8) WHERE $7::bool)
                 SELECT (SELECT count(*) FROM rel), (SELECT count(*) FROM ended),
                        (SELECT count(*) FROM notified), (SELECT count(*) FROM unlocked),
                        set_config('idle_session_timeout', $8::text, false)",
            ),
            // $1 lease, $2 holder, $3 term, $4 successor, $5 new version, $6 ttl_ms, $7
            // notification payload, $8 lock key, $9 whether to unlock it, $10
            // idle_session_timeout afterwards.
            //
            // If the row names the grant (not itself a reservation), ends its term as
            // `handed_over` and leaves the row naming the successor at the same term with
            // `previous_end = 'handed_over'`: a reservation. It has no lock (`lock_pid` NULL, the
            // lock is given back), so contenders see it orphaned and take it over by its new
            // version only after watching it for a TTL; the successor's acquire is granted at
            // once (the row names it). The unlock happens before the commit, as for release.
            hand_over: fill(
                "WITH ho AS (
                    UPDATE {schema}.leases
                    SET holder = $4::text, version = $5::text, ttl_ms = $6::int8, lock_pid = NULL,
                        previous_end = 'handed_over', renewed_at = now()
                    WHERE name = $1::text AND holder = $2::text AND term = $3::int8
                      AND previous_end IS NULL
                    RETURNING term
                 ),
                 ended AS (
                    UPDATE {schema}.history AS h SET ended_at = now(), end_reason = 'handed_over'
                    FROM ho
                    WHERE h.name = $1::text AND h.term = ho.term AND h.ended_at IS NULL
                    RETURNING h.term
                 ),
                 notified AS (SELECT pg_notify('{channel}', $7::text) FROM ho),
                 unlocked AS (SELECT pg_advisory_unlock($8::int8) WHERE $9::bool)
                 SELECT (SELECT count(*) FROM ho), (SELECT count(*) FROM ended),
                        (SELECT count(*) FROM notified), (SELECT count(*) FROM unlocked),
                        set_config('idle_session_timeout', $10::text, false)",
            ),
            // $1 lock keys, $2 idle_session_timeout afterwards.
            unlock: "SELECT (SELECT count(*) FROM unnest($1::int8[]) AS k WHERE pg_advisory_unlock(k)),
                            set_config('idle_session_timeout', $2::text, false)"
                .into(),
            // $1 lease, $2 term, $3 holder, $4 notification payload → the number of terms broken.
            break_lease: fill(
                "WITH brk AS (
                    UPDATE {schema}.leases
                    SET holder = NULL, ttl_ms = NULL, version = NULL, lock_pid = NULL,
                        previous_end = 'broken'
                    WHERE name = $1::text AND term = $2::int8 AND holder = $3::text
                    RETURNING term
                 ),
                 ended AS (
                    UPDATE {schema}.history AS h SET ended_at = now(), end_reason = 'broken'
                    FROM brk
                    WHERE h.name = $1::text AND h.term = brk.term AND h.ended_at IS NULL
                    RETURNING h.term
                 ),
                 notified AS (SELECT pg_notify('{channel}', $4::text) FROM brk)
                 SELECT (SELECT count(*) FROM brk), (SELECT count(*) FROM ended),
                        (SELECT count(*) FROM notified)",
            ),
            // $1 lease, $2 limit → newest first.
            history: fill(
                "SELECT term, holder,
                        (extract(epoch FROM acquired_at) * 1000)::int8,
                        (extract(epoch FROM ended_at) * 1000)::int8,
                        end_reason
                 FROM {schema}.history WHERE name = $1::text
                 ORDER BY term DESC LIMIT $2::int8",
            ),
        }
    }
}
