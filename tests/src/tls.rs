//! A TLS-terminating proxy in front of the local RabbitMQ, so that `amqps://` is tested end to
//! end without a broker configured for TLS: the client speaks TLS to the proxy, which checks
//! nothing and forwards plain AMQP to the broker.
//!
//! The proxy's certificate is issued for `localhost` by a certificate authority made for the
//! run; [`TlsProxy::ca_file`] is that authority's certificate in PEM, for `cacertfile`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::TlsAcceptor;

/// A proxy listening on 127.0.0.1 with TLS, forwarding to `upstream`; stops when dropped.
#[derive(Debug)]
pub struct TlsProxy {
    /// The port it listens on.
    pub port: u16,
    /// The PEM file of the certificate authority that issued the proxy's certificate.
    pub ca_file: PathBuf,
    /// TLS sessions it accepted (handshake done).
    pub sessions: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl TlsProxy {
    /// Starts a proxy to `upstream` (the broker's plain AMQP port).
    pub async fn start(upstream: SocketAddr) -> TlsProxy {
        TlsProxy::start_speaking(upstream, false).await
    }

    /// Starts a proxy to `upstream`, a PostgreSQL server: it answers the client's `SSLRequest`
    /// with `S`, as a server with TLS does, then speaks TLS and forwards the rest in plain text.
    pub async fn start_postgres(upstream: SocketAddr) -> TlsProxy {
        TlsProxy::start_speaking(upstream, true).await
    }

    async fn start_speaking(upstream: SocketAddr, postgres: bool) -> TlsProxy {
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "Hexeract test CA");
        let ca_cert = ca_params.self_signed(&ca_key).expect("CA certificate");
        let issuer = Issuer::new(ca_params, ca_key);
        let leaf_key = KeyPair::generate().expect("leaf key");
        let leaf = CertificateParams::new(vec!["localhost".to_owned()])
            .expect("leaf params")
            .signed_by(&leaf_key, &issuer)
            .expect("leaf certificate");

        let dir = std::env::temp_dir().join(format!("hexeract-tls-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let ca_file = dir.join("ca.pem");
        std::fs::write(&ca_file, ca_cert.pem()).expect("CA file");

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der())),
            )
            .expect("server config");
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let sessions = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = sessions.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let counted = counted.clone();
                tokio::spawn(async move {
                    let mut client = client;
                    if postgres {
                        use tokio::io::{AsyncReadExt, AsyncWriteExt};
                        // SSLRequest: length 8, code 80877103.
                        let mut request = [0u8; 8];
                        if client.read_exact(&mut request).await.is_err()
                            || request != [0, 0, 0, 8, 4, 210, 22, 47]
                            || client.write_all(b"S").await.is_err()
                        {
                            return;
                        }
                    }
                    let Ok(mut tls) = acceptor.accept(client).await else {
                        return;
                    };
                    counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let Ok(mut broker) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut broker).await;
                });
            }
        });
        TlsProxy {
            port,
            ca_file,
            sessions,
            task,
        }
    }
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(dir) = self.ca_file.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
