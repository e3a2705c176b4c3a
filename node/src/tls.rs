//! TLS on the Kafka listener (SSL, SASL_SSL) and on the follower links to it,
//! with rustls on ring.
//!
//! Loaded once at start (`Tls::load`, before any listener binds), from PEM
//! files with Kafka's setting names: `ssl.keystore.location` holds this
//! node's private key and certificate chain, `ssl.truststore.location` the
//! certificate authorities that client certificates and leaders' certificates
//! must chain to, `ssl.client.auth` whether a client certificate is asked for.
//! A file that cannot be used fails the start with its path and the reason.
//!
//! What TLS costs: the plaintext listener gathers a fetch response's record
//! bytes straight from the cache's buffers into `sendmsg` (no copy); on a TLS
//! listener rustls encrypts them into its own records, one copy and one pass
//! of AES-GCM or ChaCha20 per byte (`server::write_frame_tls`). Produce is
//! decrypted into the frame buffer the plaintext path reads into.
//!
//! An mTLS client's principal is its certificate's subject as RFC 4514
//! prints it (`User:CN=writer,OU=eng,O=example`), Kafka's default
//! (`ssl.principal.mapping.rules=DEFAULT`).

use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures_rustls::{TlsAcceptor, TlsConnector};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use skiff_security::{KafkaPrincipal, PrincipalMapper};
use thiserror::Error;

use crate::config::{ClientAuth, NodeConfig};

#[derive(Debug, Error)]
pub enum TlsError {
    #[error("{setting} {path}: {reason}")]
    File {
        setting: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("TLS settings: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("ssl.client.auth with ssl.truststore.location: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

/// This node's TLS: the listener's acceptor and the followers' connector.
#[derive(Clone)]
pub struct Tls {
    pub acceptor: TlsAcceptor,
    pub connector: TlsConnector,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls")
    }
}

impl Tls {
    /// The node's TLS when a listener is SSL or SASL_SSL (None otherwise).
    pub fn load(config: &NodeConfig) -> Result<Option<Tls>, TlsError> {
        let any_tls = config
            .listeners
            .iter()
            .any(|l| config.protocol_of(&l.name).is_some_and(|p| p.tls()));
        if !any_tls {
            return Ok(None);
        }
        let keystore = config
            .ssl_keystore
            .as_deref()
            .ok_or_else(|| TlsError::File {
                setting: "ssl.keystore.location",
                path: PathBuf::new(),
                reason: "not set".into(),
            })?;
        let (chain, key) = read_keystore(keystore)?;
        let roots = match &config.ssl_truststore {
            Some(path) => Some(Arc::new(read_truststore(path)?)),
            None => None,
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = server_config(
            provider.clone(),
            roots.clone(),
            config.ssl_client_auth,
            chain.clone(),
            key.clone_key(),
        )?;
        // Followers trust what the truststore vouches for and show this
        // node's own certificate, for leaders that ask for one.
        let roots = roots.unwrap_or_else(|| Arc::new(RootCertStore::empty()));
        let client = client_config(roots, Some((chain, key)))?;
        Ok(Some(Tls {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            connector: TlsConnector::from(client),
        }))
    }
}

/// A client's TLS: servers must chain to `roots`; `identity`, a certificate
/// chain and its key, is shown to servers that ask for one.
fn client_config(
    roots: Arc<RootCertStore>,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    Ok(Arc::new(match identity {
        Some((chain, key)) => builder.with_client_auth_cert(chain, key)?,
        None => builder.with_no_client_auth(),
    }))
}

/// The TLS of a command-line client (`skiff topic`, `skiff acl`, ...): the
/// truststore's authorities and, for mTLS, a PEM keystore.
pub fn cli_client_config(
    truststore: &Path,
    keystore: Option<&Path>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let roots = Arc::new(read_truststore(truststore)?);
    let identity = keystore.map(read_keystore).transpose()?;
    client_config(roots, identity)
}

fn server_config(
    provider: Arc<CryptoProvider>,
    roots: Option<Arc<RootCertStore>>,
    client_auth: ClientAuth,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<ServerConfig, TlsError> {
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match (client_auth, roots) {
        (ClientAuth::None, _) => builder.with_no_client_auth(),
        (_, None) => {
            return Err(TlsError::File {
                setting: "ssl.truststore.location",
                path: PathBuf::new(),
                reason: "not set, and ssl.client.auth asks for client certificates".into(),
            })
        }
        (ClientAuth::Requested, Some(roots)) => builder.with_client_cert_verifier(
            WebPkiClientVerifier::builder_with_provider(roots, provider)
                .allow_unauthenticated()
                .build()?,
        ),
        (ClientAuth::Required, Some(roots)) => builder.with_client_cert_verifier(
            WebPkiClientVerifier::builder_with_provider(roots, provider).build()?,
        ),
    };
    Ok(builder.with_single_cert(chain, key)?)
}

fn read_pem(setting: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::File {
        setting,
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// A PEM keystore: one private key and its certificate chain (leaf first).
fn read_keystore(
    path: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    const SETTING: &str = "ssl.keystore.location";
    let fail = |reason: String| TlsError::File {
        setting: SETTING,
        path: path.to_path_buf(),
        reason,
    };
    let pem = read_pem(SETTING, path)?;
    let chain = rustls_pemfile::certs(&mut BufReader::new(pem.as_slice()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(format!("reading its certificates: {e}")))?;
    let key = rustls_pemfile::private_key(&mut BufReader::new(pem.as_slice()))
        .map_err(|e| fail(format!("reading its private key: {e}")))?;
    let key = match key {
        Some(key) => key,
        None if contains(&pem, b"ENCRYPTED PRIVATE KEY") => {
            return Err(fail(
                "its private key is encrypted: decrypt it (`openssl pkey -in KEY -out PLAIN`) \
                 and keep the file readable only by the node"
                    .into(),
            ))
        }
        None => {
            return Err(fail(
                "no private key in it (PEM, PKCS#8, PKCS#1 or SEC1)".into(),
            ))
        }
    };
    if chain.is_empty() {
        return Err(fail("no certificate in it (PEM CERTIFICATE blocks)".into()));
    }
    Ok((chain, key))
}

/// A PEM truststore: the certificate authorities trusted.
fn read_truststore(path: &Path) -> Result<RootCertStore, TlsError> {
    const SETTING: &str = "ssl.truststore.location";
    let fail = |reason: String| TlsError::File {
        setting: SETTING,
        path: path.to_path_buf(),
        reason,
    };
    let pem = read_pem(SETTING, path)?;
    let mut roots = RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut BufReader::new(pem.as_slice())) {
        let cert = cert.map_err(|e| fail(format!("reading its certificates: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| fail(format!("a certificate in it: {e}")))?;
    }
    if roots.is_empty() {
        return Err(fail("no certificate in it (PEM CERTIFICATE blocks)".into()));
    }
    Ok(roots)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Who a client that showed `leaf` (already verified against the
/// truststore) is: `User:` and the name `mapper` gives its subject (RFC
/// 4514). `Ok(None)`: the subject cannot be decoded (the handshake accepted
/// it, so this is not expected; the connection is then ANONYMOUS).
/// `Err`: no mapping rule matches the subject (the connection is refused).
pub fn principal_of(
    leaf: &CertificateDer<'_>,
    mapper: &PrincipalMapper,
) -> Result<Option<KafkaPrincipal>, String> {
    use x509_cert::der::Decode;
    let Ok(cert) = x509_cert::Certificate::from_der(leaf.as_ref()) else {
        return Ok(None);
    };
    let subject = cert.tbs_certificate.subject.to_string();
    match mapper.name(&subject) {
        Some(name) => Ok(Some(KafkaPrincipal::user(name))),
        None => Err(format!(
            "no ssl.principal.mapping.rules rule matches the client certificate's subject {subject:?}"
        )),
    }
}

/// A follower's connection to its leader: plaintext, or TLS when the
/// listener is SSL or SASL_SSL.
pub enum LinkStream {
    Plain(glommio::net::TcpStream),
    Tls(Box<futures_rustls::client::TlsStream<glommio::net::TcpStream>>),
}

impl LinkStream {
    /// Connects to `addr`, then runs the TLS handshake when `tls` is given,
    /// checking the leader's certificate against the truststore and the
    /// name (`host`, an address or a DNS name) the leader registered.
    pub async fn connect(
        addr: std::net::SocketAddr,
        host: &str,
        tls: Option<&Tls>,
    ) -> std::io::Result<LinkStream> {
        let stream = glommio::net::TcpStream::connect(addr)
            .await
            .map_err(std::io::Error::from)?;
        let _ = stream.set_nodelay(true);
        let Some(tls) = tls else {
            return Ok(LinkStream::Plain(stream));
        };
        let name = rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("leader host {host:?} as a TLS server name: {e}"),
            )
        })?;
        let stream = tls.connector.connect(name, stream).await?;
        Ok(LinkStream::Tls(Box::new(stream)))
    }
}

impl futures_lite::AsyncRead for LinkStream {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut [u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.get_mut() {
            LinkStream::Plain(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            LinkStream::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl futures_lite::AsyncWrite for LinkStream {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.get_mut() {
            LinkStream::Plain(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            LinkStream::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            LinkStream::Plain(s) => std::pin::Pin::new(s).poll_flush(cx),
            LinkStream::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_close(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            LinkStream::Plain(s) => std::pin::Pin::new(s).poll_close(cx),
            LinkStream::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_close(cx),
        }
    }
}
