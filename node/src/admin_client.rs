//! A small blocking Kafka admin client for `skiff topic ...`: it speaks the Kafka
//! protocol (Metadata, CreateTopics, DeleteTopics, DescribeConfigs) over a plain
//! TCP connection, so the commands work against any Kafka-compatible server.
//!
//! On a SASL listener it logs in first when `SKIFF_SASL_USERNAME` and
//! `SKIFF_SASL_PASSWORD` are set (`SKIFF_SASL_MECHANISM`: PLAIN,
//! SCRAM-SHA-256 or SCRAM-SHA-512, the default): environment variables, so the
//! password stays out of `ps`. On an SSL or SASL_SSL listener it speaks TLS
//! when `SKIFF_SSL_TRUSTSTORE_LOCATION` names the PEM authorities to trust
//! (and `SKIFF_SSL_KEYSTORE_LOCATION` a PEM key and certificate chain, for
//! listeners that ask for a client certificate).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse,
    DescribeConfigsRequest, DescribeConfigsResponse, MetadataRequest, MetadataResponse,
    RequestHeader, ResponseHeader,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};

pub struct AdminClient {
    stream: Stream,
    correlation_id: i32,
}

/// Largest response accepted (the admin responses are small).
const MAX_RESPONSE_BYTES: usize = 64 << 20;

impl AdminClient {
    /// Connects to the first reachable address of a comma-separated bootstrap list.
    pub fn connect(bootstrap: &str) -> anyhow::Result<AdminClient> {
        let mut last_error = None;
        for server in bootstrap
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            let addrs = match server.to_socket_addrs() {
                Ok(a) => a,
                Err(e) => {
                    last_error = Some(anyhow::anyhow!("{server}: {e}"));
                    continue;
                }
            };
            for addr in addrs {
                match TcpStream::connect_timeout(&addr, Duration::from_secs(10)) {
                    Ok(stream) => {
                        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
                        stream.set_write_timeout(Some(Duration::from_secs(60)))?;
                        let stream =
                            Stream::from_env(stream, server).with_context(|| format!("{addr}"))?;
                        let mut client = AdminClient {
                            stream,
                            correlation_id: 0,
                        };
                        client.login_from_env().with_context(|| format!("{addr}"))?;
                        return Ok(client);
                    }
                    Err(e) => last_error = Some(anyhow::anyhow!("{addr}: {e}")),
                }
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("empty bootstrap list")))
            .context("connecting to the cluster")
    }

    /// SASL login with the user the environment names, if any.
    fn login_from_env(&mut self) -> anyhow::Result<()> {
        use kafka_protocol::messages::{
            SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
            SaslHandshakeResponse,
        };
        use skiff_security::{Mechanism, ScramClient, ScramMechanism};
        let (Ok(user), Ok(password)) = (
            std::env::var("SKIFF_SASL_USERNAME"),
            std::env::var("SKIFF_SASL_PASSWORD"),
        ) else {
            return Ok(());
        };
        let mechanism = match std::env::var("SKIFF_SASL_MECHANISM") {
            Ok(name) => {
                Mechanism::parse(&name).with_context(|| format!("SKIFF_SASL_MECHANISM {name:?}"))?
            }
            Err(_) => Mechanism::Scram(ScramMechanism::Sha512),
        };
        let handshake = SaslHandshakeRequest::default()
            .with_mechanism(StrBytes::from_static_str(mechanism.name()));
        let r: SaslHandshakeResponse = self.call(&handshake, 1)?;
        if r.error_code != 0 {
            bail!("SASL handshake for {mechanism}: error {}", r.error_code);
        }
        let mut round = |bytes: Vec<u8>| -> anyhow::Result<Bytes> {
            let request = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(bytes));
            let r: SaslAuthenticateResponse = self.call(&request, 1)?;
            if r.error_code != 0 {
                bail!(
                    "SASL login as {user}: {} (error {})",
                    r.error_message.as_deref().unwrap_or("refused"),
                    r.error_code
                );
            }
            Ok(r.auth_bytes)
        };
        match mechanism {
            Mechanism::Plain => {
                round(format!("\0{user}\0{password}").into_bytes())?;
            }
            Mechanism::Scram(m) => {
                let mut client = ScramClient::new(m, &user, &password)?;
                let server_first = round(client.first())?;
                let last = client.last(&server_first)?;
                let server_final = round(last)?;
                client.verify(&server_final)?;
            }
        }
        Ok(())
    }

    /// How long a response may take before `receive` gives up (60 s unless set).
    pub fn set_read_timeout(&mut self, timeout: Duration) -> anyhow::Result<()> {
        self.stream
            .tcp()
            .set_read_timeout(Some(timeout))
            .context("setting the read timeout")
    }

    /// Sends one request at `version` and decodes its response.
    pub fn call<Req, Resp>(&mut self, request: &Req, version: i16) -> anyhow::Result<Resp>
    where
        Req: Request + Encodable + HeaderVersion,
        Resp: Decodable,
    {
        let correlation_id = self.send(request, version)?;
        self.receive::<Req, Resp>(correlation_id, version)
    }

    /// Sends a request without waiting for its answer (pipelining); returns its
    /// correlation id for `receive`.
    pub fn send<Req>(&mut self, request: &Req, version: i16) -> anyhow::Result<i32>
    where
        Req: Request + Encodable + HeaderVersion,
    {
        self.correlation_id += 1;
        let header = RequestHeader::default()
            .with_request_api_key(Req::KEY)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation_id)
            .with_client_id(Some(StrBytes::from_static_str("skiff-admin")));
        let mut body = BytesMut::new();
        header.encode(&mut body, Req::header_version(version))?;
        request.encode(&mut body, version)?;
        let mut frame = BytesMut::with_capacity(4 + body.len());
        frame.put_i32(body.len() as i32);
        frame.extend_from_slice(&body);
        self.stream.write_all(&frame).context("sending request")?;
        Ok(self.correlation_id)
    }

    /// Reads the next response, which must answer `correlation_id`.
    pub fn receive<Req, Resp>(&mut self, correlation_id: i32, version: i16) -> anyhow::Result<Resp>
    where
        Req: Request,
        Resp: Decodable,
    {
        let mut size = [0u8; 4];
        self.stream
            .read_exact(&mut size)
            .context("reading response size")?;
        let size = i32::from_be_bytes(size);
        if size < 0 || size as usize > MAX_RESPONSE_BYTES {
            bail!("response size {size} out of range");
        }
        let mut buf = vec![0u8; size as usize];
        self.stream
            .read_exact(&mut buf)
            .context("reading response")?;
        let mut buf = Bytes::from(buf);
        let api_key = ApiKey::try_from(Req::KEY)
            .map_err(|_| anyhow::anyhow!("unknown api key {}", Req::KEY))?;
        let header = ResponseHeader::decode(&mut buf, api_key.response_header_version(version))?;
        if header.correlation_id != correlation_id {
            bail!(
                "correlation id {} does not match {correlation_id}",
                header.correlation_id
            );
        }
        let response = Resp::decode(&mut buf, version)?;
        if buf.has_remaining() {
            tracing::debug!(extra = buf.remaining(), "response had trailing bytes");
        }
        Ok(response)
    }

    pub fn metadata(&mut self, topics: Option<Vec<String>>) -> anyhow::Result<MetadataResponse> {
        let request = MetadataRequest::default()
            .with_topics(topics.map(|names| {
                names
                    .into_iter()
                    .map(|n| {
                        kafka_protocol::messages::metadata_request::MetadataRequestTopic::default()
                            .with_name(Some(kafka_protocol::messages::TopicName(
                                StrBytes::from_string(n),
                            )))
                    })
                    .collect()
            }))
            .with_allow_auto_topic_creation(false);
        self.call(&request, 12)
    }

    pub fn create_topics(
        &mut self,
        request: &CreateTopicsRequest,
    ) -> anyhow::Result<CreateTopicsResponse> {
        self.call(request, 7)
    }

    pub fn delete_topics(
        &mut self,
        request: &DeleteTopicsRequest,
    ) -> anyhow::Result<DeleteTopicsResponse> {
        self.call(request, 5)
    }

    pub fn describe_configs(
        &mut self,
        request: &DescribeConfigsRequest,
    ) -> anyhow::Result<DescribeConfigsResponse> {
        self.call(request, 4)
    }
}

/// The connection: plaintext, or TLS when the environment names a truststore.
enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Stream {
    fn from_env(tcp: TcpStream, server: &str) -> anyhow::Result<Stream> {
        let Some(truststore) = std::env::var_os("SKIFF_SSL_TRUSTSTORE_LOCATION") else {
            return Ok(Stream::Plain(tcp));
        };
        let keystore = std::env::var_os("SKIFF_SSL_KEYSTORE_LOCATION");
        let config = crate::tls::cli_client_config(
            std::path::Path::new(&truststore),
            keystore.as_deref().map(std::path::Path::new),
        )?;
        // The certificate is checked against the name the server was given by.
        let host = server
            .rsplit_once(':')
            .map_or(server, |(host, _)| host)
            .trim_start_matches('[')
            .trim_end_matches(']');
        let name = rustls::pki_types::ServerName::try_from(host.to_string())
            .with_context(|| format!("{host:?} as a TLS server name"))?;
        let connection = rustls::ClientConnection::new(config, name)?;
        let mut stream = rustls::StreamOwned::new(connection, tcp);
        // The handshake now, so a refused certificate is reported as such.
        while stream.conn.is_handshaking() {
            stream
                .conn
                .complete_io(&mut stream.sock)
                .context("TLS handshake")?;
        }
        Ok(Stream::Tls(Box::new(stream)))
    }

    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => &s.sock,
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}
