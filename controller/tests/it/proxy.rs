//! A relay the test can cut and restore: in front of the Docker engine's
//! socket (an engine that goes away mid-run) or of the api's port (an api
//! that is down). Cutting drops every open connection and refuses new ones.

use std::path::{Path, PathBuf};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio_util::sync::CancellationToken;

/// Where a relay listens and what it relays to.
#[derive(Clone)]
enum Ends {
    Unix {
        listen: PathBuf,
        target: PathBuf,
    },
    Tcp {
        listen: std::net::SocketAddr,
        target: std::net::SocketAddr,
    },
}

pub struct Relay {
    ends: Ends,
    cut: CancellationToken,
}

impl Relay {
    /// A relay at `listen` (a socket file, made) to the socket `target`.
    pub async fn unix(listen: &Path, target: &Path) -> Relay {
        let mut relay = Relay {
            ends: Ends::Unix {
                listen: listen.to_path_buf(),
                target: target.to_path_buf(),
            },
            cut: CancellationToken::new(),
        };
        relay.restore().await;
        relay
    }

    /// A relay on a loopback port to `target`; its address is [`Relay::addr`].
    pub async fn tcp(target: std::net::SocketAddr) -> Relay {
        let port = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let mut relay = Relay {
            ends: Ends::Tcp {
                listen: port,
                target,
            },
            cut: CancellationToken::new(),
        };
        relay.restore().await;
        relay
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        match &self.ends {
            Ends::Tcp { listen, .. } => *listen,
            Ends::Unix { .. } => panic!("a Unix relay has no address"),
        }
    }

    /// Drops every connection and stops listening.
    pub fn cut(&mut self) {
        self.cut.cancel();
        if let Ends::Unix { listen, .. } = &self.ends {
            let _ = std::fs::remove_file(listen);
        }
    }

    /// Listens (again).
    pub async fn restore(&mut self) {
        self.cut = CancellationToken::new();
        let cut = self.cut.clone();
        match self.ends.clone() {
            Ends::Unix { listen, target } => {
                let _ = std::fs::remove_file(&listen);
                let listener = UnixListener::bind(&listen).unwrap();
                tokio::spawn(async move {
                    loop {
                        let accepted = tokio::select! {
                            a = listener.accept() => a,
                            _ = cut.cancelled() => return,
                        };
                        let Ok((inbound, _)) = accepted else { return };
                        let Ok(outbound) = tokio::net::UnixStream::connect(&target).await else {
                            continue;
                        };
                        tokio::spawn(pipe(inbound, outbound, cut.clone()));
                    }
                });
            }
            Ends::Tcp { listen, target } => {
                // The port was ours a moment ago; it may take a few tries.
                let listener = loop {
                    match TcpListener::bind(listen).await {
                        Ok(l) => break l,
                        Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
                    }
                };
                tokio::spawn(async move {
                    loop {
                        let accepted = tokio::select! {
                            a = listener.accept() => a,
                            _ = cut.cancelled() => return,
                        };
                        let Ok((inbound, _)) = accepted else { return };
                        let Ok(outbound) = tokio::net::TcpStream::connect(target).await else {
                            continue;
                        };
                        tokio::spawn(pipe(inbound, outbound, cut.clone()));
                    }
                });
            }
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
    }
}

async fn pipe<A, B>(mut a: A, mut b: B, cut: CancellationToken)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut a, &mut b) => {}
        _ = cut.cancelled() => {}
    }
}
