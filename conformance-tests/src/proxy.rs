//! A TCP proxy that disrupts the traffic between a networked store's client and its server.
//!
//! No toxiproxy binary is installable on our machines, so this is a small tokio proxy driven by
//! the same [`Faults`] switchboard as the in-process [`FaultyStore`](crate::FaultyStore).

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::faults::{Direction, Fault, Faults};

/// A TCP proxy on `127.0.0.1` in front of one upstream server, whose traffic follows its
/// [`Faults`] at runtime.
///
/// Every accepted connection gets its own upstream connection and two pumps, one per
/// direction (client to server is [`Direction::Request`], server to client is
/// [`Direction::Reply`]). Each pump honours the current fault of its direction:
///
/// - `Pass`: forwards.
/// - `Delay(d)`: forwards each chunk `d` after it was read, in order.
/// - `Blackhole`: reads and discards, keeps both sockets open, sends no FIN.
/// - `Reset`: closes both sockets with `SO_LINGER` 0, so both peers see a TCP reset. A request
///   reset breaks every connection at once and every new one as soon as it is accepted; a reply
///   reset lets requests through and breaks the connection when the server answers (the request
///   was applied, its reply is lost).
///
/// Dropping the proxy stops it: the listener and every pump are aborted.
///
/// # Examples
///
/// ```no_run
/// use leasehold_conformance::{Direction, Fault, FaultProxy};
///
/// # async fn demo() -> std::io::Result<()> {
/// let proxy = FaultProxy::start("127.0.0.1:6379".parse().unwrap()).await?;
/// let url = format!("redis://{}", proxy.addr()); // the client connects here
/// proxy.faults().set(Direction::Both, Fault::Blackhole); // partition
/// proxy.faults().heal();
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    faults: Faults,
    accept: JoinHandle<()>,
    pumps: Arc<Mutex<Vec<AbortHandle>>>,
    connections: Arc<std::sync::atomic::AtomicU64>,
}

impl FaultProxy {
    /// Starts a proxy to `upstream`, listening on `127.0.0.1` on a free port.
    ///
    /// # Errors
    ///
    /// When the listening socket cannot be bound.
    pub async fn start(upstream: SocketAddr) -> io::Result<FaultProxy> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let faults = Faults::new();
        let pumps = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let accept = tokio::spawn(accept_loop(
            listener,
            upstream,
            faults.clone(),
            pumps.clone(),
            connections.clone(),
        ));
        Ok(FaultProxy {
            addr,
            upstream,
            faults,
            accept,
            pumps,
            connections,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server the proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// The switchboard of this proxy (clones share it).
    pub fn faults(&self) -> Faults {
        self.faults.clone()
    }

    /// How many client connections the proxy has accepted.
    pub fn connections(&self) -> u64 {
        self.connections.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        for pump in self.pumps.lock().expect("pumps lock").drain(..) {
            pump.abort();
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    faults: Faults,
    pumps: Arc<Mutex<Vec<AbortHandle>>>,
    connections: Arc<std::sync::atomic::AtomicU64>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // Out of file descriptors or similar: back off a little and keep serving.
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        connections.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let faults = faults.clone();
        let task = tokio::spawn(async move {
            if faults.get(Direction::Request) == Fault::Reset {
                reset(&client);
                return;
            }
            let Ok(server) = TcpStream::connect(upstream).await else {
                reset(&client);
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            let kill = CancellationToken::new();
            let requests = tokio::spawn(pump(
                client_read,
                server_write,
                Direction::Request,
                faults.clone(),
                kill.clone(),
            ));
            let replies = tokio::spawn(pump(server_read, client_write, Direction::Reply, faults, kill));
            // Aborting this task must stop both pumps.
            let _guard = AbortOnDrop(vec![requests.abort_handle(), replies.abort_handle()]);
            let _ = tokio::join!(requests, replies);
        });
        let mut pumps = pumps.lock().expect("pumps lock");
        pumps.retain(|pump| !pump.is_finished());
        pumps.push(task.abort_handle());
    }
}

struct AbortOnDrop(Vec<AbortHandle>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for handle in &self.0 {
            handle.abort();
        }
    }
}

/// Makes the close of `stream` send a reset instead of a FIN.
fn reset(stream: &TcpStream) {
    let _ = stream.set_zero_linger();
}

/// Why a pump stopped.
enum End {
    /// The source closed and everything was forwarded: close our write side (FIN).
    Finished,
    /// The connection is to be reset.
    Reset,
}

async fn pump(
    mut src: OwnedReadHalf,
    mut dst: OwnedWriteHalf,
    direction: Direction,
    faults: Faults,
    kill: CancellationToken,
) {
    let end = forward(&mut src, &mut dst, direction, &faults, &kill).await;
    match end {
        End::Finished => {
            let _ = dst.shutdown().await;
        }
        End::Reset => {
            kill.cancel();
            reset(src.as_ref());
            reset(dst.as_ref());
            // Closing without shutdown: the socket goes when both halves are dropped, with a
            // reset because of the zero linger.
            dst.forget();
        }
    }
}

async fn forward(
    src: &mut OwnedReadHalf,
    dst: &mut OwnedWriteHalf,
    direction: Direction,
    faults: &Faults,
    kill: &CancellationToken,
) -> End {
    let mut changes = faults.subscribe();
    let mut queue: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    let mut buf = vec![0u8; 16 * 1024];
    let mut eof = false;
    loop {
        let fault = changes.borrow_and_update().get(direction);
        if direction == Direction::Request && fault == Fault::Reset {
            return End::Reset;
        }
        if eof && queue.is_empty() && fault != Fault::Blackhole {
            return End::Finished;
        }
        let due = queue.front().map(|(due, _)| *due);
        tokio::select! {
            () = kill.cancelled() => return End::Reset,
            changed = changes.changed() => {
                if changed.is_err() {
                    return End::Reset;
                }
            }
            read = src.read(&mut buf), if !eof => match read {
                Ok(0) => eof = true,
                Ok(n) => match faults.get(direction) {
                    Fault::Pass if queue.is_empty() => {
                        if !write(dst, &buf[..n], kill).await {
                            return End::Reset;
                        }
                    }
                    Fault::Pass => queue.push_back((Instant::now(), buf[..n].to_vec())),
                    Fault::Delay(d) => queue.push_back((Instant::now() + d, buf[..n].to_vec())),
                    Fault::Blackhole => {}
                    Fault::Reset => return End::Reset,
                },
                Err(_) => return End::Reset,
            },
            () = async { tokio::time::sleep_until(due.expect("guarded")).await }, if due.is_some() => {
                let (_, chunk) = queue.pop_front().expect("guarded");
                match faults.get(direction) {
                    Fault::Blackhole => {}
                    Fault::Reset => return End::Reset,
                    Fault::Pass | Fault::Delay(_) => {
                        if !write(dst, &chunk, kill).await {
                            return End::Reset;
                        }
                    }
                }
            }
        }
    }
}

/// Writes `chunk` unless the connection is killed first; `false` when it could not.
async fn write(dst: &mut OwnedWriteHalf, chunk: &[u8], kill: &CancellationToken) -> bool {
    tokio::select! {
        () = kill.cancelled() => false,
        written = dst.write_all(chunk) => written.is_ok(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = socket.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn round_trip(stream: &mut TcpStream, msg: &[u8]) -> io::Result<Vec<u8>> {
        stream.write_all(msg).await?;
        let mut got = vec![0u8; msg.len()];
        stream.read_exact(&mut got).await?;
        Ok(got)
    }

    async fn proxy() -> (FaultProxy, TcpStream) {
        let proxy = FaultProxy::start(echo_server().await).await.unwrap();
        let stream = TcpStream::connect(proxy.addr()).await.unwrap();
        (proxy, stream)
    }

    #[tokio::test]
    async fn passes() {
        let (proxy, mut stream) = proxy().await;
        assert_eq!(round_trip(&mut stream, b"hello").await.unwrap(), b"hello");
        let big = vec![7u8; 200_000];
        assert_eq!(round_trip(&mut stream, &big).await.unwrap(), big);
        assert_eq!(proxy.connections(), 1);
    }

    #[tokio::test]
    async fn delays_each_direction() {
        let (proxy, mut stream) = proxy().await;
        let faults = proxy.faults();
        faults.set(Direction::Request, Fault::Delay(Duration::from_millis(150)));
        let started = std::time::Instant::now();
        assert_eq!(round_trip(&mut stream, b"one").await.unwrap(), b"one");
        let one = started.elapsed();
        assert!(one >= Duration::from_millis(150), "{one:?}");

        faults.set(Direction::Both, Fault::Delay(Duration::from_millis(150)));
        let started = std::time::Instant::now();
        // Several chunks in a row keep their order and are delayed once each, not cumulatively.
        for i in 0..5u8 {
            stream.write_all(&[i]).await.unwrap();
        }
        let mut got = [0u8; 5];
        stream.read_exact(&mut got).await.unwrap();
        let both = started.elapsed();
        assert_eq!(got, [0, 1, 2, 3, 4]);
        assert!(both >= Duration::from_millis(300), "{both:?}");
        assert!(
            both < Duration::from_millis(1_500),
            "delays must not add up per chunk: {both:?}"
        );

        faults.heal();
        let started = std::time::Instant::now();
        round_trip(&mut stream, b"fast").await.unwrap();
        assert!(started.elapsed() < Duration::from_millis(150));
    }

    #[tokio::test]
    async fn blackhole_then_heal() {
        let (proxy, mut stream) = proxy().await;
        let faults = proxy.faults();
        faults.set(Direction::Both, Fault::Blackhole);
        let lost = tokio::time::timeout(Duration::from_millis(300), round_trip(&mut stream, b"lost")).await;
        assert!(
            lost.is_err(),
            "a blackholed connection must stay silent, not close: {lost:?}"
        );
        faults.heal();
        // What was sent into the blackhole is gone; new traffic flows on the same connection.
        assert_eq!(round_trip(&mut stream, b"back").await.unwrap(), b"back");

        // Replies only: the server gets the request, the client never hears back.
        faults.set(Direction::Reply, Fault::Blackhole);
        let lost = tokio::time::timeout(Duration::from_millis(300), round_trip(&mut stream, b"gone")).await;
        assert!(lost.is_err());
        faults.heal();
        assert_eq!(round_trip(&mut stream, b"again").await.unwrap(), b"again");
    }

    #[tokio::test]
    async fn reset_breaks_connections_until_healed() {
        let (proxy, mut stream) = proxy().await;
        let faults = proxy.faults();
        assert_eq!(round_trip(&mut stream, b"ok").await.unwrap(), b"ok");
        faults.set(Direction::Both, Fault::Reset);
        let err = tokio::time::timeout(Duration::from_secs(2), round_trip(&mut stream, b"x"))
            .await
            .expect("a reset must be noticed at once")
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err}");

        // New connections are accepted, then reset.
        let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
        let err = tokio::time::timeout(Duration::from_secs(2), round_trip(&mut fresh, b"x"))
            .await
            .unwrap()
            .unwrap_err();
        assert!(
            matches!(err.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe),
            "{err}"
        );

        faults.heal();
        let mut healed = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut healed, b"fine").await.unwrap(), b"fine");
    }

    #[tokio::test]
    async fn reply_reset_breaks_on_the_answer() {
        let (proxy, mut stream) = proxy().await;
        proxy.faults().set(Direction::Reply, Fault::Reset);
        let err = tokio::time::timeout(Duration::from_secs(2), round_trip(&mut stream, b"x"))
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err}");
    }

    #[tokio::test]
    async fn dropping_the_proxy_stops_it() {
        let (proxy, mut stream) = proxy().await;
        let addr = proxy.addr();
        drop(proxy);
        // Aborted tasks are dropped when the runtime next polls them.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buf))
            .await
            .unwrap();
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        assert!(TcpStream::connect(addr).await.is_err());
    }
}
