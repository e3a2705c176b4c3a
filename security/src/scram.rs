//! SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677), the server side, as
//! Kafka speaks it: no channel binding, the authorization id (if any) equal
//! to the user name, credentials stored as salt, stored key, server key and
//! iteration count (never the password).
//!
//! ```text
//! client-first  n,,n=alice,r=<client nonce>          -> ScramServer::client_first
//! server-first  r=<client nonce><server nonce>,s=<salt>,i=<iterations>
//! client-final  c=biws,r=<nonce>,p=<proof>            -> ScramServer::client_final
//! server-final  v=<server signature>                  => authenticated as alice
//! ```

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha512};
use subtle::ConstantTimeEq;

/// Kafka's bounds on a credential's iteration count.
pub const MIN_ITERATIONS: u32 = 4096;
pub const MAX_ITERATIONS: u32 = 16384;
/// Bytes of randomness in a server nonce and a generated salt.
const NONCE_BYTES: usize = 24;
const SALT_BYTES: usize = 24;
/// A client message longer than this is refused before it is parsed.
pub const MAX_MESSAGE_BYTES: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScramMechanism {
    Sha256,
    Sha512,
}

impl ScramMechanism {
    pub const ALL: [ScramMechanism; 2] = [ScramMechanism::Sha256, ScramMechanism::Sha512];

    pub fn name(self) -> &'static str {
        match self {
            ScramMechanism::Sha256 => "SCRAM-SHA-256",
            ScramMechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    /// Kafka's mechanism type in AlterUserScramCredentials and
    /// DescribeUserScramCredentials (0 is UNKNOWN).
    pub fn kafka_type(self) -> i8 {
        match self {
            ScramMechanism::Sha256 => 1,
            ScramMechanism::Sha512 => 2,
        }
    }

    pub fn from_kafka_type(t: i8) -> Option<Self> {
        ScramMechanism::ALL
            .into_iter()
            .find(|m| m.kafka_type() == t)
    }

    pub fn from_name(name: &str) -> Option<Self> {
        ScramMechanism::ALL.into_iter().find(|m| m.name() == name)
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            ScramMechanism::Sha256 => Sha256::digest(data).to_vec(),
            ScramMechanism::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        // HMAC takes a key of any length: new_from_slice cannot fail.
        match self {
            ScramMechanism::Sha256 => match Hmac::<Sha256>::new_from_slice(key) {
                Ok(mut m) => {
                    m.update(data);
                    m.finalize().into_bytes().to_vec()
                }
                Err(_) => Vec::new(),
            },
            ScramMechanism::Sha512 => match Hmac::<Sha512>::new_from_slice(key) {
                Ok(mut m) => {
                    m.update(data);
                    m.finalize().into_bytes().to_vec()
                }
                Err(_) => Vec::new(),
            },
        }
    }

    /// RFC 5802's Hi(): PBKDF2 with this mechanism's HMAC, one block.
    pub fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        match self {
            ScramMechanism::Sha256 => {
                let mut out = [0u8; 32];
                pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out);
                out.to_vec()
            }
            ScramMechanism::Sha512 => {
                let mut out = [0u8; 64];
                pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out);
                out.to_vec()
            }
        }
    }
}

impl std::fmt::Display for ScramMechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a server keeps of a user's password for one mechanism.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramCredential {
    pub mechanism: ScramMechanism,
    pub salt: Vec<u8>,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
    pub iterations: u32,
}

impl std::fmt::Debug for ScramCredential {
    /// Keys are secrets in all but name: never in a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramCredential")
            .field("mechanism", &self.mechanism)
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl ScramCredential {
    /// From the salted password a client sends in AlterUserScramCredentials.
    pub fn from_salted_password(
        mechanism: ScramMechanism,
        salt: &[u8],
        salted_password: &[u8],
        iterations: u32,
    ) -> Self {
        let client_key = mechanism.hmac(salted_password, b"Client Key");
        ScramCredential {
            mechanism,
            salt: salt.to_vec(),
            stored_key: mechanism.hash(&client_key),
            server_key: mechanism.hmac(salted_password, b"Server Key"),
            iterations,
        }
    }

    pub fn from_password(
        mechanism: ScramMechanism,
        password: &str,
        salt: &[u8],
        iterations: u32,
    ) -> Self {
        let salted = mechanism.salted_password(password.as_bytes(), salt, iterations);
        Self::from_salted_password(mechanism, salt, &salted, iterations)
    }

    /// With a fresh random salt.
    pub fn generate(
        mechanism: ScramMechanism,
        password: &str,
        iterations: u32,
    ) -> Result<Self, ScramError> {
        let salt = random_bytes::<SALT_BYTES>()?;
        Ok(Self::from_password(mechanism, password, &salt, iterations))
    }

    /// Whether `password` is the one this credential was made from (SASL
    /// PLAIN checks passwords against the SCRAM credentials, so a user has one
    /// password for both).
    pub fn verify_password(&self, password: &str) -> bool {
        let salted =
            self.mechanism
                .salted_password(password.as_bytes(), &self.salt, self.iterations);
        let client_key = self.mechanism.hmac(&salted, b"Client Key");
        bool::from(self.mechanism.hash(&client_key).ct_eq(&self.stored_key))
    }

    /// Kafka's bounds on the iteration count.
    pub fn check_iterations(iterations: i32) -> Result<u32, ScramError> {
        u32::try_from(iterations)
            .ok()
            .filter(|i| (MIN_ITERATIONS..=MAX_ITERATIONS).contains(i))
            .ok_or(ScramError::Iterations(iterations))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScramError {
    #[error("invalid SCRAM message: {0}")]
    Malformed(&'static str),
    #[error("SCRAM message of {0} bytes is too long")]
    TooLong(usize),
    #[error("channel binding is not supported")]
    ChannelBinding,
    #[error("the authorization id is not the user name")]
    AuthzidMismatch,
    #[error("delegation tokens are not supported")]
    TokenAuth,
    /// Unknown user, or a wrong password: the client is told the same.
    #[error("Authentication failed during authentication due to invalid credentials with SASL mechanism {0}")]
    InvalidCredentials(ScramMechanism),
    #[error("the client's final message does not carry the nonce of this exchange")]
    Nonce,
    #[error("a SCRAM message out of order (expected {0})")]
    State(&'static str),
    #[error("iterations {0} out of Kafka's range {MIN_ITERATIONS}..={MAX_ITERATIONS}")]
    Iterations(i32),
    #[error("no randomness from the operating system: {0}")]
    Random(String),
}

fn random_bytes<const N: usize>() -> Result<[u8; N], ScramError> {
    let mut b = [0u8; N];
    getrandom::getrandom(&mut b).map_err(|e| ScramError::Random(e.to_string()))?;
    Ok(b)
}

/// One SCRAM exchange on one connection.
#[derive(Debug)]
pub struct ScramServer {
    mechanism: ScramMechanism,
    server_nonce: String,
    state: State,
}

#[derive(Debug)]
enum State {
    AwaitingClientFirst,
    AwaitingClientFinal {
        user: String,
        credential: ScramCredential,
        gs2_header: String,
        client_first_bare: String,
        server_first: String,
        nonce: String,
    },
    Done,
}

impl ScramServer {
    /// A new exchange with a random server nonce.
    pub fn new(mechanism: ScramMechanism) -> Result<Self, ScramError> {
        let nonce = B64.encode(random_bytes::<NONCE_BYTES>()?);
        Ok(Self::with_nonce(mechanism, nonce))
    }

    /// With a given server nonce (printable, no comma): tests.
    pub fn with_nonce(mechanism: ScramMechanism, server_nonce: String) -> Self {
        ScramServer {
            mechanism,
            server_nonce,
            state: State::AwaitingClientFirst,
        }
    }

    pub fn mechanism(&self) -> ScramMechanism {
        self.mechanism
    }

    /// Takes the client-first message; `lookup` gives the user's credential
    /// for this mechanism. Returns the server-first message.
    pub fn client_first(
        &mut self,
        message: &[u8],
        lookup: impl FnOnce(&str) -> Option<ScramCredential>,
    ) -> Result<Vec<u8>, ScramError> {
        if !matches!(self.state, State::AwaitingClientFirst) {
            self.state = State::Done;
            return Err(ScramError::State("no more messages"));
        }
        self.state = State::Done; // whatever fails below ends the exchange
        let message = text(message)?;
        let first = parse_client_first(message)?;
        let credential = lookup(&first.user)
            .filter(|c| c.mechanism == self.mechanism)
            .ok_or(ScramError::InvalidCredentials(self.mechanism))?;
        let nonce = format!("{}{}", first.client_nonce, self.server_nonce);
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&credential.salt),
            credential.iterations
        );
        self.state = State::AwaitingClientFinal {
            user: first.user,
            credential,
            gs2_header: first.gs2_header.to_string(),
            client_first_bare: first.bare.to_string(),
            server_first: server_first.clone(),
            nonce,
        };
        Ok(server_first.into_bytes())
    }

    /// Takes the client-final message. Returns the authenticated user name
    /// and the server-final message.
    pub fn client_final(&mut self, message: &[u8]) -> Result<(String, Vec<u8>), ScramError> {
        let State::AwaitingClientFinal {
            user,
            credential,
            gs2_header,
            client_first_bare,
            server_first,
            nonce,
        } = std::mem::replace(&mut self.state, State::Done)
        else {
            return Err(ScramError::State("the client-first message"));
        };
        let message = text(message)?;
        let (without_proof, proof) = message
            .rsplit_once(",p=")
            .ok_or(ScramError::Malformed("no proof (p=)"))?;
        let mut fields = without_proof.split(',');
        let channel = fields
            .next()
            .and_then(|f| f.strip_prefix("c="))
            .ok_or(ScramError::Malformed("no channel binding (c=)"))?;
        let got_nonce = fields
            .next()
            .and_then(|f| f.strip_prefix("r="))
            .ok_or(ScramError::Malformed("no nonce (r=)"))?;
        // Extensions may follow; none is understood (RFC 5802: ignore).
        if B64.decode(channel).ok().as_deref() != Some(gs2_header.as_bytes()) {
            return Err(ScramError::ChannelBinding);
        }
        // Kafka's rule, not RFC 5802's equality: the nonce must end with the
        // one sent. librdkafka before 2.x sends its own nonce again in front
        // (Debian's kcat does), and Kafka accepted it for years; the proof
        // below is computed over the message as sent, so it still binds.
        if !got_nonce.ends_with(nonce.as_str()) {
            return Err(ScramError::Nonce);
        }
        let proof = B64
            .decode(proof)
            .map_err(|_| ScramError::Malformed("the proof is not base64"))?;
        let m = self.mechanism;
        let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
        let client_signature = m.hmac(&credential.stored_key, auth_message.as_bytes());
        if proof.len() != client_signature.len() {
            return Err(ScramError::InvalidCredentials(m));
        }
        let client_key: Vec<u8> = proof
            .iter()
            .zip(&client_signature)
            .map(|(a, b)| a ^ b)
            .collect();
        if !bool::from(m.hash(&client_key).ct_eq(&credential.stored_key)) {
            return Err(ScramError::InvalidCredentials(m));
        }
        let server_signature = m.hmac(&credential.server_key, auth_message.as_bytes());
        Ok((
            user,
            format!("v={}", B64.encode(server_signature)).into_bytes(),
        ))
    }
}

fn text(message: &[u8]) -> Result<&str, ScramError> {
    if message.len() > MAX_MESSAGE_BYTES {
        return Err(ScramError::TooLong(message.len()));
    }
    std::str::from_utf8(message).map_err(|_| ScramError::Malformed("not UTF-8"))
}

struct ClientFirst<'a> {
    gs2_header: &'a str,
    bare: &'a str,
    user: String,
    client_nonce: &'a str,
}

/// `gs2-header client-first-message-bare`, where gs2-header is
/// `n|y , [a=authzid] ,` and the bare part `n=user,r=nonce[,ext...]`.
fn parse_client_first(message: &str) -> Result<ClientFirst<'_>, ScramError> {
    let (cbind, rest) = message
        .split_once(',')
        .ok_or(ScramError::Malformed("no GS2 header"))?;
    match cbind {
        "n" | "y" => {}
        c if c.starts_with("p=") => return Err(ScramError::ChannelBinding),
        _ => return Err(ScramError::Malformed("bad channel binding flag")),
    }
    let (authzid, bare) = rest
        .split_once(',')
        .ok_or(ScramError::Malformed("no GS2 header"))?;
    let gs2_header = &message[..message.len() - bare.len()];
    if bare.starts_with("m=") {
        return Err(ScramError::Malformed(
            "mandatory extensions are not supported",
        ));
    }
    let mut fields = bare.split(',');
    let user = fields
        .next()
        .and_then(|f| f.strip_prefix("n="))
        .ok_or(ScramError::Malformed("no user name (n=)"))
        .and_then(decode_sasl_name)?;
    let client_nonce = fields
        .next()
        .and_then(|f| f.strip_prefix("r="))
        .filter(|n| !n.is_empty() && n.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b','))
        .ok_or(ScramError::Malformed("no client nonce (r=)"))?;
    for ext in fields {
        if ext == "tokenauth=true" {
            return Err(ScramError::TokenAuth);
        }
    }
    if user.is_empty() {
        return Err(ScramError::Malformed("empty user name"));
    }
    if !authzid.is_empty() {
        let id = authzid
            .strip_prefix("a=")
            .ok_or(ScramError::Malformed("bad authorization id"))
            .and_then(decode_sasl_name)?;
        if id != user {
            return Err(ScramError::AuthzidMismatch);
        }
    }
    Ok(ClientFirst {
        gs2_header,
        bare,
        user,
        client_nonce,
    })
}

/// RFC 5802's saslname: "=2C" is a comma, "=3D" an equals sign, any other
/// "=" is an error.
fn decode_sasl_name(s: &str) -> Result<String, ScramError> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('=') {
        out.push_str(&rest[..at]);
        let code = rest.get(at..at + 3);
        match code {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err(ScramError::Malformed("bad escape in a name")),
        }
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
#[path = "scram_tests.rs"]
mod tests;

/// The client's side of one SCRAM exchange (what a follower uses to log in
/// to its leader's SASL listener): `first`, then `last` with the server's
/// first message, then `verify` the server's final message.
#[derive(Debug)]
pub struct ScramClient {
    mechanism: ScramMechanism,
    user: String,
    password: String,
    nonce: String,
    /// The auth message and the server signature to expect, once computed.
    expect: Option<Vec<u8>>,
}

impl ScramClient {
    pub fn new(mechanism: ScramMechanism, user: &str, password: &str) -> Result<Self, ScramError> {
        Ok(ScramClient {
            mechanism,
            user: user.to_string(),
            password: password.to_string(),
            nonce: B64.encode(random_bytes::<NONCE_BYTES>()?),
            expect: None,
        })
    }

    fn bare(&self) -> String {
        let name = self.user.replace('=', "=3D").replace(',', "=2C");
        format!("n={name},r={}", self.nonce)
    }

    /// The client-first message.
    pub fn first(&self) -> Vec<u8> {
        format!("n,,{}", self.bare()).into_bytes()
    }

    /// The client-final message, from the server-first one.
    pub fn last(&mut self, server_first: &[u8]) -> Result<Vec<u8>, ScramError> {
        let text = text(server_first)?;
        let (mut nonce, mut salt, mut iterations) = (None, None, None);
        for field in text.split(',') {
            match field.split_at_checked(2) {
                Some(("r=", v)) => nonce = Some(v),
                Some(("s=", v)) => salt = B64.decode(v).ok(),
                Some(("i=", v)) => iterations = v.parse::<u32>().ok(),
                _ => {}
            }
        }
        let nonce = nonce
            .filter(|n| n.starts_with(&self.nonce) && n.len() > self.nonce.len())
            .ok_or(ScramError::Nonce)?;
        let salt = salt.ok_or(ScramError::Malformed("no salt (s=) from the server"))?;
        let iterations = iterations
            .filter(|i| (MIN_ITERATIONS..=MAX_ITERATIONS).contains(i))
            .ok_or(ScramError::Malformed(
                "no or bad iteration count (i=) from the server",
            ))?;
        let m = self.mechanism;
        let salted = m.salted_password(self.password.as_bytes(), &salt, iterations);
        let client_key = m.hmac(&salted, b"Client Key");
        let stored_key = m.hash(&client_key);
        let without_proof = format!("c=biws,r={nonce}");
        let auth = format!("{},{text},{without_proof}", self.bare());
        let signature = m.hmac(&stored_key, auth.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(a, b)| a ^ b)
            .collect();
        let server_key = m.hmac(&salted, b"Server Key");
        self.expect = Some(m.hmac(&server_key, auth.as_bytes()));
        Ok(format!("{without_proof},p={}", B64.encode(proof)).into_bytes())
    }

    /// Checks the server-final message: the server knew the credential too.
    pub fn verify(&self, server_final: &[u8]) -> Result<(), ScramError> {
        let text = text(server_final)?;
        let expect = self
            .expect
            .as_ref()
            .ok_or(ScramError::State("the server-first message"))?;
        let got = text
            .strip_prefix("v=")
            .and_then(|v| B64.decode(v).ok())
            .ok_or(ScramError::Malformed("no server signature (v=)"))?;
        if bool::from(got.ct_eq(expect)) {
            Ok(())
        } else {
            Err(ScramError::InvalidCredentials(self.mechanism))
        }
    }
}
