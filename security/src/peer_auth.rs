//! Mutual proof of a shared secret on the controller port, before anything
//! else on the connection is decoded.
//!
//! The controller port carries Raft messages (protobuf, whose decoder has a
//! known stack overflow on crafted input) and the brokers' requests; with a
//! secret configured (`controller.secret.file`), both ends prove they know it
//! in four fixed-size messages, so a process without it never gets a byte
//! past this exchange parsed:
//!
//! ```text
//! initiator -> responder  hello      MAGIC | initiator nonce (32)
//! responder -> initiator  challenge  MAGIC | responder nonce (32)
//!                                    | HMAC(secret, "responder" | nonces)
//! initiator -> responder  proof      HMAC(secret, "initiator" | nonces)
//! responder -> initiator  verdict    ACCEPTED | REFUSED (then it closes)
//! ```
//!
//! Both nonces are fresh randomness, so a recorded exchange proves nothing on
//! another connection, and the two proofs carry different labels, so one
//! side's proof is never the other's. The initiator checks the responder's
//! proof before it sends its own: a node never talks to a controller that
//! does not know the secret. Comparisons are constant-time.
//!
//! What it does not do: it authenticates the peer, not the bytes after the
//! exchange (there is no TLS on this port yet), so a relay on the path could
//! pass the exchange along and then inject frames. Keep the controller port
//! on a private network.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// First bytes of a hello and a challenge ("skiff peer", version 1). A peer
/// that sends an RPC frame instead (no secret configured) is refused on them.
pub const MAGIC: [u8; 4] = *b"SKP1";
pub const NONCE_BYTES: usize = 32;
pub const MAC_BYTES: usize = 32;
pub const HELLO_BYTES: usize = MAGIC.len() + NONCE_BYTES;
pub const CHALLENGE_BYTES: usize = MAGIC.len() + NONCE_BYTES + MAC_BYTES;
pub const PROOF_BYTES: usize = MAC_BYTES;
/// The responder's last byte: the initiator may go on.
pub const ACCEPTED: u8 = 1;
/// The responder's last byte before it closes: the proof was wrong.
pub const REFUSED: u8 = 0;
/// Shortest secret accepted: 128 bits.
pub const MIN_SECRET_BYTES: usize = 16;

type HmacSha256 = Hmac<Sha256>;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PeerAuthError {
    #[error("the shared secret is {0} bytes; at least {MIN_SECRET_BYTES} are needed")]
    ShortSecret(usize),
    #[error(
        "the peer did not start the authentication exchange (no controller secret configured there?)"
    )]
    NotAHello,
    #[error("the peer did not answer with an authentication challenge (no controller secret configured there?)")]
    NotAChallenge,
    #[error("the peer does not know the shared secret (its proof is wrong)")]
    BadProof,
    #[error("the peer refused our proof (is the controller secret the same on every node?)")]
    Refused,
    #[error("no randomness from the operating system: {0}")]
    Random(String),
}

/// The secret both ends share. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct SharedSecret(Vec<u8>);

impl std::fmt::Debug for SharedSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedSecret(<{} bytes, redacted>)", self.0.len())
    }
}

impl SharedSecret {
    /// A secret of at least `MIN_SECRET_BYTES`; surrounding whitespace (a
    /// file's trailing newline) is not part of it.
    pub fn new(bytes: &[u8]) -> Result<Self, PeerAuthError> {
        let trimmed = bytes.trim_ascii();
        if trimmed.len() < MIN_SECRET_BYTES {
            return Err(PeerAuthError::ShortSecret(trimmed.len()));
        }
        Ok(SharedSecret(trimmed.to_vec()))
    }

    /// Whether `presented` is this secret (a bearer token), compared in
    /// constant time.
    pub fn matches(&self, presented: &[u8]) -> bool {
        use subtle::ConstantTimeEq;
        self.0.len() == presented.len() && bool::from(self.0.as_slice().ct_eq(presented))
    }

    fn mac(
        &self,
        label: &[u8],
        initiator: &[u8; NONCE_BYTES],
        responder: &[u8; NONCE_BYTES],
    ) -> [u8; MAC_BYTES] {
        // HMAC takes keys of any length: this cannot fail.
        let mut m = <HmacSha256 as Mac>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!());
        m.update(label);
        m.update(initiator);
        m.update(responder);
        m.finalize().into_bytes().into()
    }
}

const INITIATOR_LABEL: &[u8] = b"skiff controller peer: initiator";
const RESPONDER_LABEL: &[u8] = b"skiff controller peer: responder";

fn nonce() -> Result<[u8; NONCE_BYTES], PeerAuthError> {
    let mut b = [0u8; NONCE_BYTES];
    getrandom::getrandom(&mut b).map_err(|e| PeerAuthError::Random(e.to_string()))?;
    Ok(b)
}

/// The connecting end.
#[derive(Debug)]
pub struct Initiator {
    nonce: [u8; NONCE_BYTES],
}

impl Initiator {
    /// A fresh exchange and its hello.
    pub fn start() -> Result<(Self, [u8; HELLO_BYTES]), PeerAuthError> {
        Ok(Self::with_nonce(nonce()?))
    }

    fn with_nonce(nonce: [u8; NONCE_BYTES]) -> (Self, [u8; HELLO_BYTES]) {
        let mut hello = [0u8; HELLO_BYTES];
        hello[..MAGIC.len()].copy_from_slice(&MAGIC);
        hello[MAGIC.len()..].copy_from_slice(&nonce);
        (Initiator { nonce }, hello)
    }

    /// Checks the responder's proof; our proof to send if it holds.
    pub fn on_challenge(
        &self,
        secret: &SharedSecret,
        challenge: &[u8; CHALLENGE_BYTES],
    ) -> Result<[u8; PROOF_BYTES], PeerAuthError> {
        let (magic, rest) = challenge.split_at(MAGIC.len());
        if magic != MAGIC {
            return Err(PeerAuthError::NotAChallenge);
        }
        let (theirs, mac) = rest.split_at(NONCE_BYTES);
        let theirs: [u8; NONCE_BYTES] = theirs.try_into().unwrap_or_else(|_| unreachable!());
        let expected = secret.mac(RESPONDER_LABEL, &self.nonce, &theirs);
        if !bool::from(expected.ct_eq(mac)) {
            return Err(PeerAuthError::BadProof);
        }
        Ok(secret.mac(INITIATOR_LABEL, &self.nonce, &theirs))
    }

    /// The responder's verdict on our proof.
    pub fn on_verdict(verdict: u8) -> Result<(), PeerAuthError> {
        if verdict == ACCEPTED {
            Ok(())
        } else {
            Err(PeerAuthError::Refused)
        }
    }
}

/// The accepting end.
#[derive(Debug)]
pub struct Responder {
    initiator: [u8; NONCE_BYTES],
    nonce: [u8; NONCE_BYTES],
}

impl Responder {
    /// Checks the hello's form; the challenge to send.
    pub fn on_hello(
        secret: &SharedSecret,
        hello: &[u8; HELLO_BYTES],
    ) -> Result<(Self, [u8; CHALLENGE_BYTES]), PeerAuthError> {
        Self::with_nonce(secret, hello, nonce()?)
    }

    fn with_nonce(
        secret: &SharedSecret,
        hello: &[u8; HELLO_BYTES],
        nonce: [u8; NONCE_BYTES],
    ) -> Result<(Self, [u8; CHALLENGE_BYTES]), PeerAuthError> {
        let (magic, theirs) = hello.split_at(MAGIC.len());
        if magic != MAGIC {
            return Err(PeerAuthError::NotAHello);
        }
        let initiator: [u8; NONCE_BYTES] = theirs.try_into().unwrap_or_else(|_| unreachable!());
        let mut challenge = [0u8; CHALLENGE_BYTES];
        challenge[..MAGIC.len()].copy_from_slice(&MAGIC);
        challenge[MAGIC.len()..MAGIC.len() + NONCE_BYTES].copy_from_slice(&nonce);
        challenge[MAGIC.len() + NONCE_BYTES..].copy_from_slice(&secret.mac(
            RESPONDER_LABEL,
            &initiator,
            &nonce,
        ));
        Ok((Responder { initiator, nonce }, challenge))
    }

    /// Whether the initiator's proof holds (send `ACCEPTED`, else `REFUSED`
    /// and close).
    pub fn on_proof(
        &self,
        secret: &SharedSecret,
        proof: &[u8; PROOF_BYTES],
    ) -> Result<(), PeerAuthError> {
        let expected = secret.mac(INITIATOR_LABEL, &self.initiator, &self.nonce);
        if bool::from(expected.ct_eq(proof)) {
            Ok(())
        } else {
            Err(PeerAuthError::BadProof)
        }
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    fn secret(s: &str) -> SharedSecret {
        SharedSecret::new(s.as_bytes()).expect("long enough")
    }

    /// The whole exchange between two ends holding `a` and `b`: the
    /// initiator's and the responder's outcome.
    fn exchange(
        a: &SharedSecret,
        b: &SharedSecret,
    ) -> (Result<(), PeerAuthError>, Result<(), PeerAuthError>) {
        let (init, hello) = Initiator::start().expect("random");
        let (resp, challenge) = Responder::on_hello(b, &hello).expect("a hello");
        let proof = match init.on_challenge(a, &challenge) {
            Ok(p) => p,
            Err(e) => return (Err(e), Err(PeerAuthError::Refused)),
        };
        let verdict = resp.on_proof(b, &proof);
        let byte = if verdict.is_ok() { ACCEPTED } else { REFUSED };
        (Initiator::on_verdict(byte), verdict)
    }

    #[test]
    fn the_same_secret_is_accepted_at_both_ends() {
        let s = secret("correct horse battery staple");
        assert_eq!(exchange(&s, &s), (Ok(()), Ok(())));
    }

    #[test]
    fn a_responder_without_the_secret_is_caught_before_the_initiator_proves_anything() {
        let (init, hello) = Initiator::start().expect("random");
        let (_, challenge) =
            Responder::on_hello(&secret("the responder's own secret"), &hello).expect("hello");
        assert_eq!(
            init.on_challenge(&secret("the initiator's secret!"), &challenge),
            Err(PeerAuthError::BadProof)
        );
    }

    #[test]
    fn an_initiator_without_the_secret_is_refused() {
        let (init, hello) = Initiator::start().expect("random");
        let b = secret("the responder's own secret");
        let (resp, challenge) = Responder::on_hello(&b, &hello).expect("hello");
        // The responder's own MAC sent back (reflection), zeros, or a proof
        // made with another secret: all refused.
        let reflected: [u8; PROOF_BYTES] = challenge[MAGIC.len() + NONCE_BYTES..]
            .try_into()
            .expect("32");
        assert_eq!(resp.on_proof(&b, &reflected), Err(PeerAuthError::BadProof));
        assert_eq!(
            resp.on_proof(&b, &[0; PROOF_BYTES]),
            Err(PeerAuthError::BadProof)
        );
        let wrong = secret("not the responder's secret");
        // The initiator with the wrong secret already refuses the challenge;
        // a forged proof from it is refused too.
        let forged = wrong.mac(INITIATOR_LABEL, &init.nonce, &resp.nonce);
        assert_eq!(resp.on_proof(&b, &forged), Err(PeerAuthError::BadProof));
        assert_eq!(Initiator::on_verdict(REFUSED), Err(PeerAuthError::Refused));
    }

    #[test]
    fn a_proof_from_another_connection_proves_nothing() {
        let s = secret("correct horse battery staple");
        let (init, hello) = Initiator::with_nonce([1; NONCE_BYTES]);
        let (_, c1) = Responder::with_nonce(&s, &hello, [2; NONCE_BYTES]).expect("hello");
        let recorded = init.on_challenge(&s, &c1).expect("proof");
        // The same hello replayed gets a fresh responder nonce.
        let (r2, _) = Responder::with_nonce(&s, &hello, [3; NONCE_BYTES]).expect("hello");
        assert_eq!(r2.on_proof(&s, &recorded), Err(PeerAuthError::BadProof));
    }

    #[test]
    fn an_rpc_frame_instead_of_a_hello_or_challenge_is_named() {
        let s = secret("correct horse battery staple");
        // A frame header (length, CRC) where the magic should be.
        let mut frame = [0u8; HELLO_BYTES];
        frame[..4].copy_from_slice(&100u32.to_be_bytes());
        assert_eq!(
            Responder::on_hello(&s, &frame).map(|_| ()),
            Err(PeerAuthError::NotAHello)
        );
        let (init, _) = Initiator::start().expect("random");
        assert_eq!(
            init.on_challenge(&s, &[0; CHALLENGE_BYTES]),
            Err(PeerAuthError::NotAChallenge)
        );
    }

    #[test]
    fn secrets_are_trimmed_bounded_and_never_printed() {
        assert_eq!(
            SharedSecret::new(b"  short \n"),
            Err(PeerAuthError::ShortSecret(5))
        );
        let s = SharedSecret::new(b"0123456789abcdef\n").expect("16 bytes");
        assert_eq!(s, SharedSecret::new(b"0123456789abcdef").expect("16 bytes"));
        let shown = format!("{s:?}");
        assert!(!shown.contains("0123"), "{shown}");
    }
}
