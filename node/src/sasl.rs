//! SASL on a connection (SaslHandshake v1, SaslAuthenticate v0-2), Kafka's
//! way: on a SASL listener a connection may send ApiVersions, then
//! SaslHandshake naming a mechanism, then SaslAuthenticate until the exchange
//! ends; any other request before that closes the connection, and so does a
//! failed exchange (after its SASL_AUTHENTICATION_FAILED answer). The state
//! lives with the connection, on the core that serves it; credentials come
//! from the core's copy of the metadata (`TopicTable::security`).
//!
//! The exchanges themselves (PLAIN, SCRAM-SHA-256/512) are `skiff_security`'s.

use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::{
    ApiKey, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
    SaslHandshakeResponse,
};
use kafka_protocol::ResponseError;
use skiff_security::{plain, KafkaPrincipal, Mechanism, ScramServer};

use crate::config::SecurityProtocol;
use crate::kafka::str_bytes;
use crate::security::Security;

#[derive(Debug)]
enum State {
    /// A PLAINTEXT or SSL listener: no SASL. Everyone is ANONYMOUS but an
    /// SSL client that showed a certificate, who is its subject.
    Open(KafkaPrincipal),
    AwaitingHandshake,
    Handshaken(Mechanism),
    /// A SCRAM exchange between its first and final message.
    Scram(Box<ScramServer>),
    Authenticated(KafkaPrincipal),
}

/// One connection's authentication.
#[derive(Debug)]
pub struct ConnectionAuth {
    state: State,
    /// `connections.max.reauth.ms` (KIP-368): a session lasts this long and
    /// the client re-authenticates on the same connection before it ends; 0:
    /// sessions do not end.
    reauth_ms: u64,
    /// When the session ends (re-authentication pending).
    expires_at: Option<Instant>,
    /// During a re-authentication: who the connection was (it must stay so).
    reauth_of: Option<KafkaPrincipal>,
}

/// What the connection does after a SASL answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    Continue,
    /// Send the answer, then close (Kafka's rule after a refused mechanism or
    /// a failed exchange).
    Close,
}

impl ConnectionAuth {
    /// A connection to a listener of `protocol`; `certified`: the principal
    /// of the client certificate it showed in the TLS handshake (it is who
    /// the connection is on an SSL listener; SASL_SSL logs in regardless).
    pub fn new(
        protocol: SecurityProtocol,
        reauth_ms: u64,
        certified: Option<KafkaPrincipal>,
    ) -> Self {
        ConnectionAuth {
            state: if protocol.sasl() {
                State::AwaitingHandshake
            } else {
                State::Open(certified.unwrap_or_else(KafkaPrincipal::anonymous))
            },
            reauth_ms,
            expires_at: None,
            reauth_of: None,
        }
    }

    /// Whether an authenticated session ran past its lifetime without
    /// re-authenticating (Kafka closes such a connection at its next request).
    pub fn expired(&self, now: Instant) -> bool {
        matches!(self.state, State::Authenticated(_)) && self.expires_at.is_some_and(|t| now >= t)
    }

    /// The exchange succeeded as `principal`: a new session (or, when
    /// re-authenticating, the same principal's next one).
    fn authenticated(
        &mut self,
        principal: KafkaPrincipal,
        bytes: Vec<u8>,
        version: i16,
    ) -> (SaslAuthenticateResponse, Next) {
        if let Some(before) = self.reauth_of.take() {
            if before != principal {
                return (
                    SaslAuthenticateResponse::default()
                        .with_error_code(ResponseError::SaslAuthenticationFailed.code())
                        .with_error_message(Some(str_bytes(format!(
                            "Cannot change principals during re-authentication from {before}: {principal}"
                        )))),
                    Next::Close,
                );
            }
        }
        self.state = State::Authenticated(principal);
        let mut response = SaslAuthenticateResponse::default().with_auth_bytes(Bytes::from(bytes));
        if self.reauth_ms > 0 {
            self.expires_at = Some(Instant::now() + Duration::from_millis(self.reauth_ms));
            // v1+ tells the client when to re-authenticate.
            if version >= 1 {
                response.session_lifetime_ms = self.reauth_ms as i64;
            }
        }
        (response, Next::Continue)
    }

    /// Whether a request of `api_key` may be served now (SASL requests are
    /// answered by `handshake` and `authenticate` whatever the state).
    pub fn allows(&self, api_key: ApiKey) -> bool {
        matches!(self.state, State::Open(_) | State::Authenticated(_))
            || api_key == ApiKey::ApiVersions
    }

    /// Who the connection is: its SASL user, or ANONYMOUS.
    pub fn principal(&self) -> KafkaPrincipal {
        match &self.state {
            State::Authenticated(p) | State::Open(p) => p.clone(),
            _ => KafkaPrincipal::anonymous(),
        }
    }

    pub fn handshake(
        &mut self,
        enabled: &[Mechanism],
        request: &SaslHandshakeRequest,
    ) -> (SaslHandshakeResponse, Next) {
        let listed = enabled.iter().map(|m| str_bytes(m.name())).collect();
        let response = SaslHandshakeResponse::default().with_mechanisms(listed);
        // KIP-368: an authenticated connection may log in again, as itself.
        if self.reauth_ms > 0 {
            if let State::Authenticated(p) = &self.state {
                self.reauth_of = Some(p.clone());
                self.state = State::AwaitingHandshake;
            }
        }
        if !matches!(self.state, State::AwaitingHandshake) {
            // A PLAINTEXT listener, or a second handshake (re-authentication
            // is not built yet): Kafka's ILLEGAL_SASL_STATE.
            let close = if matches!(self.state, State::Open(_)) {
                Next::Continue
            } else {
                Next::Close
            };
            return (
                response.with_error_code(ResponseError::IllegalSaslState.code()),
                close,
            );
        }
        match Mechanism::parse(&request.mechanism).filter(|m| enabled.contains(m)) {
            Some(m) => {
                self.state = State::Handshaken(m);
                (response, Next::Continue)
            }
            None => (
                response.with_error_code(ResponseError::UnsupportedSaslMechanism.code()),
                Next::Close,
            ),
        }
    }

    pub fn authenticate(
        &mut self,
        security: &Security,
        request: &SaslAuthenticateRequest,
        version: i16,
    ) -> (SaslAuthenticateResponse, Next) {
        let refuse = |error: ResponseError, message: String| {
            (
                SaslAuthenticateResponse::default()
                    .with_error_code(error.code())
                    .with_error_message(Some(str_bytes(message))),
                Next::Close,
            )
        };
        let failed = |message: String| refuse(ResponseError::SaslAuthenticationFailed, message);
        let ok = |bytes: Vec<u8>| {
            (
                SaslAuthenticateResponse::default().with_auth_bytes(Bytes::from(bytes)),
                Next::Continue,
            )
        };
        match std::mem::replace(&mut self.state, State::AwaitingHandshake) {
            State::Handshaken(Mechanism::Plain) => {
                let message = match plain::parse(&request.auth_bytes) {
                    Ok(m) => m,
                    Err(e) => return failed(e.to_string()),
                };
                // Any of the user's SCRAM credentials checks the password.
                let verified = security
                    .credentials
                    .get(&message.user)
                    .and_then(|creds| creds.first())
                    .is_some_and(|c| c.verify_password(&message.password));
                if !verified {
                    return failed(
                        "Authentication failed: Invalid username or password".to_string(),
                    );
                }
                self.authenticated(KafkaPrincipal::user(message.user), Vec::new(), version)
            }
            State::Handshaken(Mechanism::Scram(m)) => {
                let mut server = match ScramServer::new(m) {
                    Ok(s) => s,
                    Err(e) => return failed(e.to_string()),
                };
                match server.client_first(&request.auth_bytes, |user| {
                    security.credential(user, m).cloned()
                }) {
                    Ok(first) => {
                        self.state = State::Scram(Box::new(server));
                        ok(first)
                    }
                    Err(e) => failed(e.to_string()),
                }
            }
            State::Scram(mut server) => match server.client_final(&request.auth_bytes) {
                Ok((user, last)) => self.authenticated(KafkaPrincipal::user(user), last, version),
                Err(e) => failed(e.to_string()),
            },
            other => {
                let message = match &other {
                    State::Open(_) => "this listener does not use SASL",
                    State::Authenticated(_) => "already authenticated",
                    _ => "SaslAuthenticate before SaslHandshake",
                };
                let close = matches!(other, State::Open(_));
                self.state = other;
                let (response, _) = refuse(ResponseError::IllegalSaslState, message.to_string());
                (response, if close { Next::Continue } else { Next::Close })
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use kafka_protocol::protocol::StrBytes;
    use skiff_security::{ScramCredential, ScramMechanism};

    fn security() -> Security {
        let mut s = Security::default();
        s.credentials.insert(
            "alice".into(),
            vec![ScramCredential::from_password(
                ScramMechanism::Sha256,
                "pw",
                b"salt",
                4096,
            )],
        );
        s
    }

    fn handshake(auth: &mut ConnectionAuth, name: &'static str) -> (i16, Next) {
        let enabled = [Mechanism::Plain, Mechanism::Scram(ScramMechanism::Sha256)];
        let req = SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(name));
        let (r, next) = auth.handshake(&enabled, &req);
        assert_eq!(r.mechanisms.len(), 2);
        (r.error_code, next)
    }

    fn auth_bytes(auth: &mut ConnectionAuth, bytes: &[u8]) -> (i16, Next) {
        let req = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::copy_from_slice(bytes));
        let (r, next) = auth.authenticate(&security(), &req, 1);
        (r.error_code, next)
    }

    #[test]
    fn plain_with_the_right_password_authenticates_the_user() {
        let mut a = ConnectionAuth::new(SecurityProtocol::SaslPlaintext, 0, None);
        assert!(!a.allows(ApiKey::Metadata));
        assert!(a.allows(ApiKey::ApiVersions));
        assert_eq!(handshake(&mut a, "PLAIN"), (0, Next::Continue));
        assert_eq!(auth_bytes(&mut a, b"\0alice\0pw"), (0, Next::Continue));
        assert!(a.allows(ApiKey::Metadata));
        assert_eq!(a.principal(), KafkaPrincipal::user("alice"));
    }

    #[test]
    fn wrong_password_unknown_user_and_bad_order_close_the_connection() {
        for bytes in [&b"\0alice\0px"[..], b"\0bob\0pw", b"garbage"] {
            let mut a = ConnectionAuth::new(SecurityProtocol::SaslPlaintext, 0, None);
            handshake(&mut a, "PLAIN");
            assert_eq!(
                auth_bytes(&mut a, bytes),
                (ResponseError::SaslAuthenticationFailed.code(), Next::Close)
            );
            assert!(!a.allows(ApiKey::Metadata));
            assert_eq!(a.principal(), KafkaPrincipal::anonymous());
        }
        let mut a = ConnectionAuth::new(SecurityProtocol::SaslPlaintext, 0, None);
        assert_eq!(
            auth_bytes(&mut a, b"\0alice\0pw"),
            (ResponseError::IllegalSaslState.code(), Next::Close)
        );
        let mut a = ConnectionAuth::new(SecurityProtocol::SaslPlaintext, 0, None);
        assert_eq!(
            handshake(&mut a, "SCRAM-SHA-512"),
            (ResponseError::UnsupportedSaslMechanism.code(), Next::Close),
            "not enabled"
        );
        assert_eq!(
            handshake(&mut a, "GSSAPI"),
            (ResponseError::UnsupportedSaslMechanism.code(), Next::Close)
        );
    }

    #[test]
    fn scram_takes_two_rounds_and_a_plaintext_listener_refuses_sasl() {
        let mut a = ConnectionAuth::new(SecurityProtocol::SaslPlaintext, 0, None);
        handshake(&mut a, "SCRAM-SHA-256");
        let req = SaslAuthenticateRequest::default()
            .with_auth_bytes(Bytes::from_static(b"n,,n=alice,r=abc"));
        let (r, next) = a.authenticate(&security(), &req, 1);
        assert_eq!((r.error_code, next), (0, Next::Continue));
        assert!(r.auth_bytes.starts_with(b"r=abc"));
        assert!(!a.allows(ApiKey::Produce), "not before the final message");
        // A wrong proof fails the exchange.
        let nonce = std::str::from_utf8(&r.auth_bytes)
            .unwrap()
            .split(',')
            .next()
            .unwrap()
            .to_string();
        let bad = format!("c=biws,{nonce},p=AAAA");
        assert_eq!(
            auth_bytes(&mut a, bad.as_bytes()),
            (ResponseError::SaslAuthenticationFailed.code(), Next::Close)
        );

        let mut open = ConnectionAuth::new(SecurityProtocol::Plaintext, 0, None);
        assert!(open.allows(ApiKey::Produce));
        assert_eq!(
            handshake(&mut open, "PLAIN"),
            (ResponseError::IllegalSaslState.code(), Next::Continue)
        );
        assert_eq!(open.principal(), KafkaPrincipal::anonymous());

        // SSL: who the client certificate says; SASL_SSL: its login, whatever
        // certificate it showed.
        let writer = KafkaPrincipal::user("CN=writer,O=example");
        let mut ssl = ConnectionAuth::new(SecurityProtocol::Ssl, 0, Some(writer.clone()));
        assert!(ssl.allows(ApiKey::Produce));
        assert_eq!(ssl.principal(), writer);
        assert_eq!(
            handshake(&mut ssl, "PLAIN"),
            (ResponseError::IllegalSaslState.code(), Next::Continue)
        );
        assert_eq!(ssl.principal(), writer);
        let sasl_ssl = ConnectionAuth::new(SecurityProtocol::SaslSsl, 0, Some(writer));
        assert!(!sasl_ssl.allows(ApiKey::Produce));
        assert_eq!(sasl_ssl.principal(), KafkaPrincipal::anonymous());
    }

    #[test]
    fn sessions_end_and_the_same_principal_logs_in_again() {
        let mut sec = security();
        sec.credentials.insert(
            "bob".into(),
            vec![ScramCredential::from_password(
                ScramMechanism::Sha256,
                "pw2",
                b"salt",
                4096,
            )],
        );
        let auth_as = |a: &mut ConnectionAuth, bytes: &[u8]| {
            let req =
                SaslAuthenticateRequest::default().with_auth_bytes(Bytes::copy_from_slice(bytes));
            let (r, next) = a.authenticate(&sec, &req, 1);
            (r.error_code, r.session_lifetime_ms, next)
        };
        let mut a = ConnectionAuth::new(SecurityProtocol::SaslPlaintext, 1000, None);
        handshake(&mut a, "PLAIN");
        assert_eq!(auth_as(&mut a, b"\0alice\0pw"), (0, 1000, Next::Continue));
        let now = Instant::now();
        assert!(!a.expired(now));
        assert!(a.expired(now + Duration::from_secs(2)));
        // Re-authentication on the same connection: allowed, as alice.
        assert_eq!(handshake(&mut a, "PLAIN"), (0, Next::Continue));
        assert_eq!(auth_as(&mut a, b"\0alice\0pw"), (0, 1000, Next::Continue));
        assert!(!a.expired(Instant::now()), "a new session");
        assert_eq!(a.principal(), KafkaPrincipal::user("alice"));
        // ... but not as someone else.
        assert_eq!(handshake(&mut a, "PLAIN"), (0, Next::Continue));
        let (code, _, next) = auth_as(&mut a, b"\0bob\0pw2");
        assert_eq!(
            (code, next),
            (ResponseError::SaslAuthenticationFailed.code(), Next::Close)
        );
        // Without connections.max.reauth.ms a second handshake is refused.
        let mut a = ConnectionAuth::new(SecurityProtocol::SaslPlaintext, 0, None);
        handshake(&mut a, "PLAIN");
        assert_eq!(auth_as(&mut a, b"\0alice\0pw"), (0, 0, Next::Continue));
        assert!(!a.expired(Instant::now() + Duration::from_secs(3600)));
        assert_eq!(
            handshake(&mut a, "PLAIN"),
            (ResponseError::IllegalSaslState.code(), Next::Close)
        );
    }
}
