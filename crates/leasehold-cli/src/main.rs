//! `leasehold`: run any command as a leader-only process, and look at or break leases.
//!
//! ```text
//! leasehold run --store sqlite:///var/lib/leasehold/leases.db --lease nightly-report -- ./report.sh
//! leasehold status nightly-report
//! leasehold status --prefix nightly-          # every lease whose name starts with it
//! leasehold history nightly-report --limit 5
//! leasehold watch nightly-report
//! leasehold break nightly-report
//! leasehold handover nightly-report --to web-2  # the holder hands over to web-2
//! leasehold run --store postgres://db/leases --lease api-writer --http 0.0.0.0:9090   # a sidecar
//! leasehold shards run --group partitions --shards 64 -- ./worker.sh   # once per owned shard
//! leasehold shards status partitions
//! ```
//!
//! See `docs/cli.md` in the repository for every option, the exit codes, and how the command is
//! kept from outliving the lease.

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod child;
mod contain;
mod exit;
mod guard;
mod handover;
mod http;
mod inspect;
mod output;
mod run;
mod shards;
mod tree;

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, CommandFactory, Parser, Subcommand};

use crate::exit::Failure;

/// The exit-code table of `--help` (docs/cli.md has the same table; tests check both).
const EXIT_CODES: &str = "\
Exit codes:
  0        success (`watch`: interrupted)
  1        runtime error: the store failed during the operation, a corrupt record, ...
  2        usage or configuration error (bad arguments, URL, lease name, timing)
  3        the store is unreachable or cannot be opened, or did not answer
  4        the store does not support the operation (`break`; listing: `status` without a
           lease name, `shards`)
  5        `run --wait`: not elected in time; the command was not run
  6        the store refused the credentials or permissions, or is another service, or
           its table is missing (`run`: after retrying for --auth-retry, or --wait
           when shorter)
  7        `run --http`: the address cannot be listened on (in use, not permitted, not
           local)
  8        `handover`: nobody holds the lease: nothing to hand over
  9        `handover`: the successor did not take the lease (not within --within, another
           candidate took it, or another handover is in progress)
  126, 127 `run`, `shards run`: the command is not executable, or not found
  129, 130, 143
           `run`, `shards run`, `handover`: stopped by SIGHUP, SIGINT or SIGTERM (the command,
           or every shard's, was stopped, the leases released; the request given back)
  N        `run`: the command's exit status; 128 + N when it was killed by signal N";

/// Leader election from the shell: run a command on exactly one of many hosts or processes.
#[derive(Debug, Parser)]
#[command(name = "leasehold", version, propagate_version = true, max_term_width = 100)]
#[command(after_help = EXIT_CODES)]
struct Cli {
    /// The lease store, e.g. sqlite:///var/lib/leasehold/leases.db.
    #[arg(
        long,
        env = "LEASEHOLD_STORE",
        global = true,
        value_name = "URL",
        hide_env_values = true
    )]
    store: Option<String>,

    /// Print JSON for scripts instead of tables (`watch`: one JSON object per line).
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a command while this process leads a lease; stop it before the lease can pass on.
    ///
    /// Campaigns for LEASE; when elected, starts CMD with LEASEHOLD_LEASE, LEASEHOLD_HOLDER and
    /// LEASEHOLD_TERM (the fencing token) in its environment, and renews the lease while CMD
    /// runs. Every process CMD starts stays within reach (a cgroup v2 leaf where one can be made,
    /// child subreapers everywhere), also after setsid or a double fork. When leadership ends,
    /// all of them get SIGTERM, then SIGKILL after --kill-grace until none is left, early enough
    /// that they are gone before the lease could be granted to anyone else. If this process dies,
    /// even by SIGKILL, they are killed too.
    ///
    /// When CMD exits, what it left behind is ended, then the lease is released and leasehold
    /// exits with CMD's status (with --keep-running: campaigns again and restarts CMD, after a
    /// growing delay while it keeps failing). SIGINT, SIGTERM or SIGHUP stop CMD the same way,
    /// release the lease and exit with 128 + the signal number; a second signal kills CMD at
    /// once.
    ///
    /// With --http ADDR, serves /healthz, /readyz (200 only while this instance leads),
    /// /leader and /metrics; CMD is then optional: without it, leasehold only holds the lease
    /// beside an application that asks it who leads (a sidecar).
    Run(RunArgs),

    /// Show who holds each lease, at which term, and for how long the store keeps it.
    ///
    /// Without a lease name, lists every lease of the store (with --prefix, those whose name
    /// starts with it), where the store can list its leases.
    Status {
        /// The leases to show [default: every lease of the store].
        #[arg(value_name = "LEASE")]
        leases: Vec<String>,
        /// List only the leases whose name starts with PREFIX (instead of naming them).
        #[arg(long, value_name = "PREFIX", conflicts_with = "leases")]
        prefix: Option<String>,
    },

    /// Show the recorded terms of a lease: who led, when, and how each term ended.
    History {
        /// The lease.
        lease: String,
        /// How many of the most recent terms to show.
        #[arg(long, default_value_t = 20, value_name = "N")]
        limit: usize,
    },

    /// Print a line whenever the leader of a lease changes, until interrupted.
    Watch {
        /// The lease.
        lease: String,
        /// How often to ask the store [default: the holder's ttl / 5, within 100ms..=2s; 1s while
        /// nobody holds the lease]. Stores with change notifications are also listened to.
        #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
        interval: Option<Duration>,
    },

    /// Force the holder of a lease out (an operator's tool; not every store can).
    ///
    /// The term ends as `broken` and the lease is free at once. The deposed holder learns it at
    /// its next renewal; a `leasehold run` holder then stops its command, but that may take up to
    /// its renew interval plus its kill grace, while a new leader can start at once.
    Break {
        /// The lease.
        lease: String,
    },

    /// Ask the holder of a lease to hand it over to the candidate ID, and wait until ID leads.
    ///
    /// The request goes through the store: this command holds the lease LEASE.handover as ID
    /// until done. A holder that watches requests (every `leasehold run`; a library Elector only
    /// when built with `hand_over_requests(true)`, off by default) reads it once per renewal,
    /// stops its work (its command gets SIGTERM, then SIGKILL after its kill grace), and hands
    /// the lease over: the store keeps it for ID, which takes it at its next notification or poll
    /// with a higher term. Where the store lists its candidates (etcd, ZooKeeper, Redis), ID must
    /// be campaigning, or nothing is asked (exit 9); elsewhere it is not checked. Exits 0 once ID
    /// leads; if ID does not take it within --within, the lease opens to everyone after its TTL.
    Handover {
        /// The lease.
        lease: String,
        /// The successor's candidate id (its `leasehold run --id`); it must be campaigning.
        #[arg(long, value_name = "ID")]
        to: String,
        /// How long to wait for ID to lead [default: 3 x the holder's ttl].
        #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
        within: Option<Duration>,
    },

    /// Lease groups: N shards, each run by exactly one live member, balanced over the members.
    #[command(subcommand)]
    Shards(ShardsCommand),

    /// Print a completion script for SHELL to standard output.
    ///
    /// bash: `leasehold completions bash > /etc/bash_completion.d/leasehold`; zsh: into a
    /// directory of your $fpath as `_leasehold`; fish: `~/.config/fish/completions/leasehold.fish`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },

    /// Print the manual page (roff) to standard output: `leasehold man > leasehold.1`.
    Man,

    /// Internal: the small supervisor `run` puts at the head of the command's process group.
    #[command(name = "__child-guard", hide = true)]
    ChildGuard(guard::GuardArgs),
}

/// `leasehold shards ...`.
#[derive(Debug, Subcommand)]
enum ShardsCommand {
    /// Join a lease group and run a command once per shard this process owns.
    ///
    /// The group's N shards (0..N-1) are shared among the live members (every `shards run` of
    /// GROUP on the store), in proportion to their --weight, and each shard is owned by at most
    /// one member at any instant, with its own fencing term. For each shard it owns, this member
    /// starts CMD with LEASEHOLD_GROUP, LEASEHOLD_SHARD (the shard number), LEASEHOLD_SHARDS (N),
    /// LEASEHOLD_LEASE (the shard's lease), LEASEHOLD_HOLDER (this member's id) and
    /// LEASEHOLD_TERM (the shard's fencing token) in its environment, contained as `run`
    /// contains its command: its own process group, every process it starts within reach, SIGTERM
    /// then SIGKILL after --kill-grace when the shard moves away or its lease ends, gone before
    /// the shard can be granted to another member.
    ///
    /// When a shard's CMD exits, the shard is released and runs again (at a higher term) when the
    /// group next gives it to a member. SIGINT, SIGTERM or SIGHUP stop every shard's CMD the same
    /// way, release the shards and the membership, and exit with 128 + the signal number; a
    /// second signal kills them at once. If this process dies, even by SIGKILL, every CMD is
    /// killed, and the other members take its shards over once their leases expire.
    Run(ShardsRunArgs),

    /// Show a lease group's members and the owner and term of each shard.
    Status {
        /// The group.
        group: String,
    },
}

/// The arguments of `leasehold shards run`.
#[derive(Debug, Args)]
struct ShardsRunArgs {
    /// The group's name (letters, digits, '-', '_', '.'); its leases are GROUP.m.* (members) and
    /// GROUP.s.* (shards).
    #[arg(long, value_name = "NAME")]
    group: String,

    /// How many shards the group has (1 to 100000); every member must say the same.
    #[arg(long, value_name = "N")]
    shards: u32,

    /// This member's id, the holder of its shards [default: HOST-PID-RANDOM].
    #[arg(long, value_name = "ID")]
    id: Option<String>,

    /// How long the store keeps a shard (and the membership) after each renewal: also bounds how
    /// long a crashed member's shards stay unowned.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    ttl: Duration,

    /// This member's share of the shards relative to the others' (1 to 1000).
    #[arg(long, default_value_t = 1, value_name = "W")]
    weight: u32,

    /// How long CMD gets between SIGTERM and SIGKILL when a shard's ownership ends [default: 2s,
    /// or ttl / 5 when smaller]. Must fit in the lease, as for `run`.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    kill_grace: Option<Duration>,

    /// Contain each CMD's tree with child subreapers only, even where a cgroup v2 leaf could be
    /// made.
    #[arg(long)]
    no_cgroup: bool,

    /// Do not print what happens to the shards on stderr (failures that end leasehold are
    /// printed all the same).
    #[arg(long, short)]
    quiet: bool,

    /// Start each line on stderr with the time (RFC 3339, UTC, milliseconds).
    #[arg(long, value_enum, value_name = "WHEN", default_value = "auto", num_args = 0..=1,
          default_missing_value = "always", require_equals = true)]
    timestamps: Timestamps,

    /// The command to run for each owned shard, and its arguments (after `--`).
    #[arg(required = true, last = true, value_name = "CMD", value_parser = clap::value_parser!(OsString))]
    command: Vec<OsString>,
}

/// When `run` starts its log lines with the time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Timestamps {
    /// When stderr is not a terminal, and not the systemd journal (which stamps lines itself).
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

/// The arguments of `leasehold run`.
#[derive(Debug, Args)]
struct RunArgs {
    /// The lease to campaign for (letters, digits, '-', '_', '.').
    #[arg(long, value_name = "NAME")]
    lease: String,

    /// This candidate's id, shown to others as the holder [default: HOST-PID-RANDOM].
    #[arg(long, value_name = "ID")]
    id: Option<String>,

    /// How long the store keeps the lease after each renewal (renewed every ttl / 3).
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    ttl: Duration,

    /// How long CMD gets between SIGTERM and SIGKILL when leadership ends [default: 2s, or
    /// ttl / 5 when smaller]. Must fit in the lease: kill-grace plus a little slack below
    /// ttl × (1 − drift) − renew-every (ttl / 3); `run` says by how much when it does not.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    kill_grace: Option<Duration>,

    /// When CMD exits, campaign again and restart it instead of exiting. While it keeps failing
    /// (non-zero status, killed by a signal), each restart waits twice as long as the one before:
    /// 1s, 2s, 4s, ... up to 1m; a run that succeeds or lasts 1m resets the delay.
    #[arg(long)]
    keep_running: bool,

    /// Give up when not elected within DURATION of starting: exit with status 5 without running
    /// CMD [default: campaign for as long as it takes].
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    wait: Option<Duration>,

    /// How long authentication and permission failures of the store (a wrong password, key or
    /// SAS token, missing rights) are retried before giving up with exit status 6.
    #[arg(long, default_value = "1m", value_parser = parse_duration, value_name = "DURATION")]
    auth_retry: Duration,

    /// Contain CMD's tree with child subreapers only, even where a cgroup v2 leaf could be made.
    #[arg(long)]
    no_cgroup: bool,

    /// Serve /healthz, /readyz (200 only while this instance leads), /leader (JSON) and
    /// /metrics (Prometheus) over HTTP on ADDR, e.g. 127.0.0.1:9090, 0.0.0.0:9090 or
    /// localhost:9090. Without CMD, `run` only campaigns and holds the lease (a sidecar): until
    /// SIGTERM, SIGINT or SIGHUP, campaigning again after a loss.
    #[arg(long, value_name = "ADDR", value_parser = parse_listen_addr)]
    http: Option<std::net::SocketAddr>,

    /// Do not print what happens to the election on stderr (failures that end leasehold, and
    /// authentication or permission failures, are printed all the same).
    #[arg(long, short)]
    quiet: bool,

    /// Start each line on stderr with the time (RFC 3339, UTC, milliseconds).
    #[arg(long, value_enum, value_name = "WHEN", default_value = "auto", num_args = 0..=1,
          default_missing_value = "always", require_equals = true)]
    timestamps: Timestamps,

    /// The command to run while leader, and its arguments (after `--`); optional with --http.
    #[arg(required_unless_present = "http", last = true, value_name = "CMD", value_parser = clap::value_parser!(OsString))]
    command: Vec<OsString>,
}

/// Parses `10s`, `500ms`, `1m`, `1h 30m`.
/// `IP:PORT`, or `HOST:PORT` resolved now (the first address), e.g. `localhost:9090`.
fn parse_listen_addr(text: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(addr) = text.parse() {
        return Ok(addr);
    }
    let hint = "expected IP:PORT or HOST:PORT, e.g. 127.0.0.1:9090, 0.0.0.0:9090 or localhost:9090";
    match text.to_socket_addrs() {
        Ok(mut addrs) => addrs
            .next()
            .ok_or_else(|| format!("{text:?} resolves to no address ({hint})")),
        Err(e) => Err(format!("{e} ({hint})")),
    }
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text.trim()).map_err(|e| format!("{e} (e.g. 10s, 500ms, 1m)"))?;
    if duration.is_zero() {
        return Err("must be greater than zero".into());
    }
    Ok(duration)
}

fn main() -> ExitCode {
    // The process that waits to become a pre-started command: no argument parser on its way.
    let raw: Vec<OsString> = std::env::args_os().collect();
    if raw.get(1).is_some_and(|a| a == guard::EXEC_WHEN_ELECTED) {
        return ExitCode::from(u8::try_from(guard::exec_when_elected(&raw[2..])).unwrap_or(1));
    }
    let cli = Cli::parse();
    let code = match cli.command {
        Command::ChildGuard(args) => guard::main(args),
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "leasehold", &mut script);
            print_out(&script)
        }
        Command::Man => {
            let mut page = Vec::new();
            match clap_mangen::Man::new(Cli::command()).render(&mut page) {
                Ok(()) => print_out(&page),
                Err(e) => Failure::runtime(format!("cannot render the manual page: {e}")).report(),
            }
        }
        command => match dispatch(cli.store, cli.json, command) {
            Ok(code) => code,
            Err(failure) => failure.report(),
        },
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// Writes `bytes` to standard output; a reader that went away (`| head`) is no error.
fn print_out(bytes: &[u8]) -> i32 {
    use std::io::Write;
    match std::io::stdout().lock().write_all(bytes) {
        Ok(()) => 0,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => Failure::runtime(format!("cannot write to standard output: {e}")).report(),
    }
}

fn dispatch(store: Option<String>, json: bool, command: Command) -> Result<i32, Failure> {
    let timestamps = match &command {
        Command::Run(args) => Some(args.timestamps),
        Command::Shards(ShardsCommand::Run(args)) => Some(args.timestamps),
        _ => None,
    };
    if let Some(timestamps) = timestamps {
        output::set_timestamps(match timestamps {
            Timestamps::Auto => output::timestamps_by_default(),
            Timestamps::Always => true,
            Timestamps::Never => false,
        });
    }
    let store = store.ok_or_else(|| Failure::usage("no store given: pass --store URL or set LEASEHOLD_STORE"))?;
    // One thread: the command's supervisor is spawned from this (main) thread, which lives as
    // long as the process, so its parent-death signal fires only when the process dies.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::runtime(format!("cannot start the runtime: {e}")))?;
    runtime.block_on(async move {
        match command {
            Command::Run(args) => run::run(&store, args).await,
            Command::Status { leases, prefix } => inspect::status(&store, &leases, prefix.as_deref(), json).await,
            Command::History { lease, limit } => inspect::history(&store, &lease, limit, json).await,
            Command::Watch { lease, interval } => inspect::watch(&store, &lease, interval, json).await,
            Command::Break { lease } => inspect::break_lease(&store, &lease, json).await,
            Command::Handover { lease, to, within } => handover::handover(&store, &lease, &to, within, json).await,
            Command::Shards(ShardsCommand::Run(args)) => shards::run(&store, args).await,
            Command::Shards(ShardsCommand::Status { group }) => shards::status(&store, &group, json).await,
            Command::ChildGuard(_) | Command::Completions { .. } | Command::Man => {
                unreachable!("handled before the runtime starts")
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1m 30s"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("10").unwrap_err().contains("e.g. 10s"));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("soon").is_err());
    }

    /// `--http localhost:9090` was `invalid socket address syntax`.
    #[test]
    fn listen_addresses_take_host_names() {
        assert_eq!(parse_listen_addr("0.0.0.0:9090"), Ok("0.0.0.0:9090".parse().unwrap()));
        let local = parse_listen_addr("localhost:9090").expect("localhost resolves");
        assert!(local.ip().is_loopback() && local.port() == 9090, "{local}");
        assert!(
            parse_listen_addr("localhost")
                .unwrap_err()
                .contains("e.g. 127.0.0.1:9090")
        );
    }
}
