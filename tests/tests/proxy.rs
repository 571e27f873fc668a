//! The fault-injecting proxy of the chaos tests (`hexeract_tests::proxy`) against a local echo
//! server: it forwards, resets, refuses, blackholes, delays and cuts as it says.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hexeract_tests::proxy::FaultProxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An echo server on a free port.
async fn echo() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buffer = [0u8; 4096];
                loop {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(read) => {
                            if stream.write_all(&buffer[..read]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    addr
}

/// Sends `bytes` and reads the echo back, within `limit`.
async fn round_trip(
    stream: &mut TcpStream,
    bytes: &[u8],
    limit: Duration,
) -> std::io::Result<Vec<u8>> {
    stream.write_all(bytes).await?;
    let mut back = vec![0u8; bytes.len()];
    match tokio::time::timeout(limit, stream.read_exact(&mut back)).await {
        Ok(read) => read.map(|_| back),
        Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
    }
}

#[tokio::test]
async fn forwards_both_ways_and_counts_connections() {
    let proxy = FaultProxy::start(echo().await).await;
    let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
    let back = round_trip(&mut client, b"hello", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(back, b"hello");
    assert_eq!(proxy.open_connections(), 1);
    assert_eq!(proxy.accepted(), 1);
}

#[tokio::test]
async fn reset_all_resets_open_connections_and_lets_new_ones_through() {
    let proxy = FaultProxy::start(echo().await).await;
    let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
    round_trip(&mut client, b"one", Duration::from_secs(5))
        .await
        .unwrap();
    proxy.reset_all();
    let mut buffer = [0u8; 8];
    let read = tokio::time::timeout(Duration::from_secs(5), client.read(&mut buffer))
        .await
        .expect("the reset arrives");
    assert!(
        matches!(&read, Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset),
        "{read:?}"
    );
    let mut again = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(
        round_trip(&mut again, b"two", Duration::from_secs(5))
            .await
            .unwrap(),
        b"two"
    );
}

#[tokio::test]
async fn refused_connections_are_reset_at_once() {
    let proxy = FaultProxy::start(echo().await).await;
    proxy.refuse(true);
    let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
    let answer = round_trip(&mut client, b"anyone?", Duration::from_secs(5)).await;
    assert!(answer.is_err(), "{answer:?}");
    proxy.refuse(false);
    let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(
        round_trip(&mut client, b"now", Duration::from_secs(5))
            .await
            .unwrap(),
        b"now"
    );
    assert_eq!(proxy.accepted(), 2);
}

#[tokio::test]
async fn a_blackhole_forwards_nothing_and_keeps_the_socket_open() {
    let proxy = FaultProxy::start(echo().await).await;
    let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
    round_trip(&mut client, b"before", Duration::from_secs(5))
        .await
        .unwrap();
    proxy.blackhole(true);
    let silent = round_trip(&mut client, b"into the void", Duration::from_millis(300)).await;
    assert_eq!(silent.unwrap_err().kind(), std::io::ErrorKind::TimedOut);
    assert_eq!(proxy.open_connections(), 1, "the connection is still open");
    proxy.blackhole(false);
    // Nothing written during the blackhole is lost: it arrives once the path is back.
    let mut late = [0u8; 13];
    tokio::time::timeout(Duration::from_secs(5), client.read_exact(&mut late))
        .await
        .expect("the held bytes arrive after the blackhole")
        .unwrap();
    assert_eq!(&late, b"into the void");
    let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(
        round_trip(&mut fresh, b"after", Duration::from_secs(5))
            .await
            .unwrap(),
        b"after"
    );
}

#[tokio::test]
async fn lost_replies_are_gone_and_the_connection_carries_on() {
    let proxy = FaultProxy::start(echo().await).await;
    let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
    proxy.lose_replies(true);
    let lost = round_trip(&mut client, b"lost", Duration::from_millis(300)).await;
    assert_eq!(lost.unwrap_err().kind(), std::io::ErrorKind::TimedOut);
    // The echo did answer: wait until its reply was read and thrown away.
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.lose_replies(false);
    // The same connection, with a hole where the lost reply was.
    assert_eq!(
        round_trip(&mut client, b"kept", Duration::from_secs(5))
            .await
            .unwrap(),
        b"kept"
    );
    assert_eq!(proxy.open_connections(), 1);
}

#[tokio::test]
async fn latency_delays_each_direction() {
    let proxy = FaultProxy::start(echo().await).await;
    proxy.latency(Duration::from_millis(100));
    let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
    let started = Instant::now();
    round_trip(&mut client, b"slow", Duration::from_secs(5))
        .await
        .unwrap();
    // There and back: at least twice the latency (a lower bound the proxy guarantees).
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_connection_is_cut_after_its_byte_budget() {
    let proxy = FaultProxy::start(echo().await).await;
    proxy.cut_after(Some(10));
    let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
    client.write_all(&[7u8; 8]).await.unwrap();
    // 8 bytes up and 2 of the 8 coming back make the budget; then the reset.
    let mut received = Vec::new();
    let mut buffer = [0u8; 64];
    let end = loop {
        match tokio::time::timeout(Duration::from_secs(5), client.read(&mut buffer)).await {
            Ok(Ok(0)) => break Ok(()),
            Ok(Ok(read)) => received.extend_from_slice(&buffer[..read]),
            Ok(Err(error)) => break Err(error),
            Err(_) => panic!("the cut never came"),
        }
    };
    assert!(received.len() <= 2, "{} bytes came back", received.len());
    assert!(
        matches!(&end, Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset),
        "{end:?}"
    );
    assert_eq!(proxy.open_connections(), 0);
}
