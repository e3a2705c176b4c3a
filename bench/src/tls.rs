//! TLS for the load generator's connections (`--tls-ca`, and `--tls-cert`
//! with `--tls-key` for listeners that want a client certificate), with
//! rustls on blocking sockets.
//!
//! The produce path reads answers on one thread while another writes
//! requests, so a TLS connection is split the same way: both halves share
//! the rustls session behind a mutex that is never held across a socket
//! call. Records are encrypted under the session lock and sent under a
//! second, write lock taken first, so TLS records reach the socket in the
//! order they were sealed; reading takes ciphertext from the socket without
//! any lock, then decrypts under the session lock.

use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::Context;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, RootCertStore};

/// TLS settings of a run: every connection it opens uses them.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// PEM certificate authorities: connect with TLS (SSL listeners),
    /// checking the server's certificate against them.
    #[arg(long, global = true)]
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate chain (with --tls-key), for listeners with
    /// ssl.client.auth.
    #[arg(long, global = true, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, global = true, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

/// `--tls-ca`: every connection of the run uses TLS.
static CONFIG: OnceLock<Arc<ClientConfig>> = OnceLock::new();
/// Servers the suite started on TLS listeners (HOST:PORT), with their
/// client settings: connections to them use TLS, others do not.
static SERVERS: Mutex<Vec<(String, Arc<ClientConfig>)>> = Mutex::new(Vec::new());

/// Turns TLS on for every connection this process opens from now on.
pub fn enable(args: &TlsArgs) -> anyhow::Result<()> {
    let Some(ca) = &args.tls_ca else {
        return Ok(());
    };
    let config = client_config(ca, args.tls_cert.as_deref(), args.tls_key.as_deref())?;
    CONFIG
        .set(config)
        .map_err(|_| anyhow::anyhow!("TLS enabled twice"))
}

/// Connections to `server` (HOST:PORT) use TLS, trusting the PEM
/// authorities in `ca`.
pub fn enable_for(server: &str, ca: &Path) -> anyhow::Result<()> {
    let config = client_config(ca, None, None)?;
    lock(&SERVERS).push((server.to_string(), config));
    Ok(())
}

fn config_for(server: &str) -> Option<Arc<ClientConfig>> {
    CONFIG.get().cloned().or_else(|| {
        lock(&SERVERS)
            .iter()
            .find(|(s, _)| s == server)
            .map(|(_, c)| c.clone())
    })
}

fn client_config(
    ca: &Path,
    cert: Option<&Path>,
    key: Option<&Path>,
) -> anyhow::Result<Arc<ClientConfig>> {
    let pem = std::fs::read(ca).with_context(|| format!("reading --tls-ca {}", ca.display()))?;
    let mut roots = RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut BufReader::new(pem.as_slice())) {
        roots.add(cert.with_context(|| format!("--tls-ca {}", ca.display()))?)?;
    }
    anyhow::ensure!(
        !roots.is_empty(),
        "--tls-ca {}: no certificate in it",
        ca.display()
    );
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let config = match (cert, key) {
        (Some(cert), Some(key)) => {
            let chain = rustls_pemfile::certs(&mut BufReader::new(
                std::fs::read(cert)
                    .with_context(|| format!("reading --tls-cert {}", cert.display()))?
                    .as_slice(),
            ))
            .collect::<Result<Vec<_>, _>>()?;
            let key = rustls_pemfile::private_key(&mut BufReader::new(
                std::fs::read(key)
                    .with_context(|| format!("reading --tls-key {}", key.display()))?
                    .as_slice(),
            ))?
            .with_context(|| format!("--tls-key {}: no private key in it", key.display()))?;
            builder.with_client_auth_cert(chain, key)?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// A connection: plaintext, or one half of a TLS session.
pub enum Stream {
    Plain(TcpStream),
    Tls(TlsHalf),
}

/// A TLS connection's half: reads and writes may run on two threads.
pub struct TlsHalf {
    sock: TcpStream,
    session: Arc<Mutex<ClientConnection>>,
    write_lock: Arc<Mutex<()>>,
    /// Ciphertext read but not yet taken by the session.
    pending: Vec<u8>,
}

impl Stream {
    /// `sock`, connected to `server` (HOST:PORT), as is, or after a TLS
    /// handshake when TLS is on for it.
    pub fn over(mut sock: TcpStream, server: &str) -> anyhow::Result<Stream> {
        let Some(config) = config_for(server) else {
            return Ok(Stream::Plain(sock));
        };
        let host = server
            .rsplit_once(':')
            .map_or(server, |(host, _)| host)
            .trim_start_matches('[')
            .trim_end_matches(']');
        let name = ServerName::try_from(host.to_string())
            .with_context(|| format!("{host:?} as a TLS server name"))?;
        let mut session = ClientConnection::new(config, name)?;
        while session.is_handshaking() {
            session
                .complete_io(&mut sock)
                .with_context(|| format!("TLS handshake with {host}"))?;
        }
        Ok(Stream::Tls(TlsHalf {
            sock,
            session: Arc::new(Mutex::new(session)),
            write_lock: Arc::new(Mutex::new(())),
            pending: Vec::new(),
        }))
    }

    /// Another handle on the same connection (the other half).
    pub fn try_clone(&self) -> std::io::Result<Stream> {
        Ok(match self {
            Stream::Plain(s) => Stream::Plain(s.try_clone()?),
            Stream::Tls(t) => Stream::Tls(TlsHalf {
                sock: t.sock.try_clone()?,
                session: t.session.clone(),
                write_lock: t.write_lock.clone(),
                pending: Vec::new(),
            }),
        })
    }

    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(t) => &t.sock,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl TlsHalf {
    /// Seals what the session has to send and sends it, in order.
    fn send_sealed(&self) -> std::io::Result<()> {
        let _order = lock(&self.write_lock);
        let mut out = Vec::new();
        {
            let mut session = lock(&self.session);
            while session.wants_write() {
                session.write_tls(&mut out)?;
            }
        }
        (&self.sock).write_all(&out)
    }
}

impl Read for TlsHalf {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let answered = {
                let mut session = lock(&self.session);
                while !self.pending.is_empty() {
                    let mut ciphertext = self.pending.as_slice();
                    match session.read_tls(&mut ciphertext) {
                        Ok(0) => break,
                        Ok(n) => {
                            self.pending.drain(..n);
                            session
                                .process_new_packets()
                                .map_err(std::io::Error::other)?;
                        }
                        // Its plaintext buffer is full: read that first.
                        Err(_) => break,
                    }
                }
                let read = session.reader().read(buf);
                let wants_write = session.wants_write();
                (read, wants_write)
            };
            let (read, wants_write) = answered;
            if wants_write {
                // A key update or alert to answer.
                self.send_sealed()?;
            }
            match read {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            let mut chunk = [0u8; 64 << 10];
            let n = (&self.sock).read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.pending.extend_from_slice(&chunk[..n]);
        }
    }
}

impl Write for TlsHalf {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _order = lock(&self.write_lock);
        let mut out = Vec::with_capacity(buf.len() + 256);
        let n = {
            let mut session = lock(&self.session);
            let n = session.writer().write(buf)?;
            while session.wants_write() {
                session.write_tls(&mut out)?;
            }
            n
        };
        (&self.sock).write_all(&out)?;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(t) => t.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(t) => t.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(t) => t.flush(),
        }
    }
}
