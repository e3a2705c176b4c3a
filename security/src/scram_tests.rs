#![allow(clippy::unwrap_used)]

use super::*;
use proptest::prelude::*;

/// A client's side of the exchange, written from RFC 5802 (what librdkafka
/// and the Java client do), to drive the server in tests.
struct Client {
    mechanism: ScramMechanism,
    user: String,
    password: String,
    nonce: String,
    gs2: String,
}

impl Client {
    fn new(m: ScramMechanism, user: &str, password: &str, nonce: &str) -> Self {
        Client {
            mechanism: m,
            user: user.into(),
            password: password.into(),
            nonce: nonce.into(),
            gs2: "n,,".into(),
        }
    }

    fn bare(&self) -> String {
        let name = self.user.replace('=', "=3D").replace(',', "=2C");
        format!("n={name},r={}", self.nonce)
    }

    fn first(&self) -> Vec<u8> {
        format!("{}{}", self.gs2, self.bare()).into_bytes()
    }

    /// (client-final, the server signature it expects)
    fn last(&self, server_first: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let sf = std::str::from_utf8(server_first).unwrap();
        let mut r = "";
        let mut s = "";
        let mut i = 0;
        for f in sf.split(',') {
            match f.split_at(2) {
                ("r=", v) => r = v,
                ("s=", v) => s = v,
                ("i=", v) => i = v.parse().unwrap(),
                _ => {}
            }
        }
        let m = self.mechanism;
        let salted = m.salted_password(self.password.as_bytes(), &B64.decode(s).unwrap(), i);
        let client_key = m.hmac(&salted, b"Client Key");
        let stored = m.hash(&client_key);
        let without = format!("c={},r={r}", B64.encode(&self.gs2));
        let auth = format!("{},{sf},{without}", self.bare());
        let sig = m.hmac(&stored, auth.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(&sig).map(|(a, b)| a ^ b).collect();
        let server_sig = m.hmac(&m.hmac(&salted, b"Server Key"), auth.as_bytes());
        (
            format!("{without},p={}", B64.encode(proof)).into_bytes(),
            format!("v={}", B64.encode(server_sig)).into_bytes(),
        )
    }
}

fn credential(m: ScramMechanism, password: &str) -> ScramCredential {
    ScramCredential::from_password(m, password, b"a fixed salt", MIN_ITERATIONS)
}

/// RFC 7677, section 3: user "user", password "pencil".
#[test]
fn rfc7677_sha256_example() {
    let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
    let cred = ScramCredential::from_password(ScramMechanism::Sha256, "pencil", &salt, 4096);
    let mut server = ScramServer::with_nonce(
        ScramMechanism::Sha256,
        "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0".into(),
    );
    let first = server
        .client_first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO", |u| {
            (u == "user").then(|| cred.clone())
        })
        .unwrap();
    assert_eq!(
        first,
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    );
    let (user, last) = server
        .client_final(
            b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
              p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
        )
        .unwrap();
    assert_eq!(user, "user");
    assert_eq!(last, b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
}

#[test]
fn both_mechanisms_authenticate_the_right_password_only() {
    for m in ScramMechanism::ALL {
        let cred = credential(m, "secret");
        for (password, ok) in [("secret", true), ("Secret", false), ("", false)] {
            let c = Client::new(m, "alice", password, "cnonce");
            let mut s = ScramServer::new(m).unwrap();
            let sf = s.client_first(&c.first(), |_| Some(cred.clone())).unwrap();
            let (cf, expect) = c.last(&sf);
            match s.client_final(&cf) {
                Ok((user, last)) => {
                    assert!(ok, "{m} accepted {password:?}");
                    assert_eq!(user, "alice");
                    assert_eq!(last, expect, "{m}: the client must be able to verify us");
                }
                Err(e) => {
                    assert!(!ok, "{m} refused {password:?}: {e}");
                    assert_eq!(e, ScramError::InvalidCredentials(m));
                }
            }
        }
    }
}

#[test]
fn unknown_user_and_other_mechanisms_credential_are_refused_alike() {
    let c = Client::new(ScramMechanism::Sha512, "bob", "pw", "n1");
    let mut s = ScramServer::new(ScramMechanism::Sha512).unwrap();
    assert_eq!(
        s.client_first(&c.first(), |_| None),
        Err(ScramError::InvalidCredentials(ScramMechanism::Sha512))
    );
    let mut s = ScramServer::new(ScramMechanism::Sha512).unwrap();
    let sha256 = credential(ScramMechanism::Sha256, "pw");
    assert_eq!(
        s.client_first(&c.first(), |_| Some(sha256)),
        Err(ScramError::InvalidCredentials(ScramMechanism::Sha512))
    );
    // The exchange is over: a final message is out of order.
    assert!(matches!(
        s.client_final(b"c=biws,r=x,p=AA=="),
        Err(ScramError::State(_))
    ));
}

#[test]
fn names_with_commas_and_equals_signs_are_decoded() {
    let m = ScramMechanism::Sha256;
    let cred = credential(m, "pw");
    let c = Client::new(m, "a,b=c", "pw", "n1");
    let mut s = ScramServer::new(m).unwrap();
    let mut asked = String::new();
    let sf = s
        .client_first(&c.first(), |u| {
            asked = u.to_string();
            Some(cred.clone())
        })
        .unwrap();
    assert_eq!(asked, "a,b=c");
    assert_eq!(s.client_final(&c.last(&sf).0).unwrap().0, "a,b=c");
    assert_eq!(
        decode_sasl_name("x=41"),
        Err(ScramError::Malformed("bad escape in a name"))
    );
    assert_eq!(
        decode_sasl_name("x="),
        Err(ScramError::Malformed("bad escape in a name"))
    );
}

#[test]
fn an_authorization_id_must_name_the_user() {
    let m = ScramMechanism::Sha256;
    let cred = credential(m, "pw");
    let mut c = Client::new(m, "alice", "pw", "n1");
    c.gs2 = "n,a=alice,".into();
    let mut s = ScramServer::new(m).unwrap();
    let sf = s.client_first(&c.first(), |_| Some(cred.clone())).unwrap();
    // The channel binding repeats the whole GS2 header, authzid included.
    assert_eq!(s.client_final(&c.last(&sf).0).unwrap().0, "alice");
    c.gs2 = "n,a=mallory,".into();
    let mut s = ScramServer::new(m).unwrap();
    assert_eq!(
        s.client_first(&c.first(), |_| Some(cred.clone())),
        Err(ScramError::AuthzidMismatch)
    );
}

#[test]
fn malformed_and_unsupported_first_messages_are_refused() {
    let m = ScramMechanism::Sha256;
    let cred = credential(m, "pw");
    let cases: [(&[u8], ScramError); 10] = [
        (b"", ScramError::Malformed("no GS2 header")),
        (b"n,,", ScramError::Malformed("no user name (n=)")),
        (b"n,,n=alice", ScramError::Malformed("no client nonce (r=)")),
        (
            b"n,,n=alice,r=",
            ScramError::Malformed("no client nonce (r=)"),
        ),
        (b"n,,n=,r=abc", ScramError::Malformed("empty user name")),
        (b"p=tls-unique,,n=alice,r=abc", ScramError::ChannelBinding),
        (
            b"x,,n=alice,r=abc",
            ScramError::Malformed("bad channel binding flag"),
        ),
        (
            b"n,,m=ext,n=alice,r=abc",
            ScramError::Malformed("mandatory extensions are not supported"),
        ),
        (b"n,,n=alice,r=abc,tokenauth=true", ScramError::TokenAuth),
        (b"n,,n=al\xffice,r=abc", ScramError::Malformed("not UTF-8")),
    ];
    for (msg, want) in cases {
        let mut s = ScramServer::new(m).unwrap();
        assert_eq!(
            s.client_first(msg, |_| Some(cred.clone())),
            Err(want),
            "{:?}",
            String::from_utf8_lossy(msg)
        );
    }
    let huge = vec![b'a'; MAX_MESSAGE_BYTES + 1];
    let mut s = ScramServer::new(m).unwrap();
    assert_eq!(
        s.client_first(&huge, |_| Some(cred.clone())),
        Err(ScramError::TooLong(MAX_MESSAGE_BYTES + 1))
    );
}

#[test]
fn final_message_checks_binding_nonce_and_order() {
    let m = ScramMechanism::Sha512;
    let cred = credential(m, "pw");
    let c = Client::new(m, "alice", "pw", "n1");
    let start = || {
        let mut s = ScramServer::with_nonce(m, "SERVER".into());
        let sf = s.client_first(&c.first(), |_| Some(cred.clone())).unwrap();
        (s, sf)
    };
    let (mut s, sf) = start();
    let good = String::from_utf8(c.last(&sf).0).unwrap();
    let other_nonce = good.replace("r=n1SERVER", "r=n1SERVEX");
    assert_eq!(
        s.client_final(other_nonce.as_bytes()),
        Err(ScramError::Nonce)
    );
    let (mut s, _) = start();
    let other_binding = good.replace("c=biws", "c=eSws");
    assert_eq!(
        s.client_final(other_binding.as_bytes()),
        Err(ScramError::ChannelBinding)
    );
    let (mut s, _) = start();
    assert_eq!(
        s.client_final(b"c=biws,r=n1SERVER"),
        Err(ScramError::Malformed("no proof (p=)"))
    );
    let (mut s, _) = start();
    assert_eq!(
        s.client_final(b"c=biws,r=n1SERVER,p=!!"),
        Err(ScramError::Malformed("the proof is not base64"))
    );
    let (mut s, _) = start();
    assert_eq!(
        s.client_final(b"c=biws,r=n1SERVER,p=AAAA"),
        Err(ScramError::InvalidCredentials(m))
    );
    // A replayed first message after the exchange started ends it.
    let (mut s, _) = start();
    assert!(matches!(
        s.client_first(&c.first(), |_| Some(cred.clone())),
        Err(ScramError::State(_))
    ));
    assert!(matches!(
        s.client_final(good.as_bytes()),
        Err(ScramError::State(_))
    ));
    // The good message succeeds once, and only once.
    let (mut s, _) = start();
    assert!(s.client_final(good.as_bytes()).is_ok());
    assert!(matches!(
        s.client_final(good.as_bytes()),
        Err(ScramError::State(_))
    ));
}

#[test]
fn credentials_verify_plain_passwords_and_bound_iterations() {
    for m in ScramMechanism::ALL {
        let c = ScramCredential::generate(m, "hunter2", MIN_ITERATIONS).unwrap();
        assert!(c.verify_password("hunter2"));
        assert!(!c.verify_password("hunter3"));
        let again = ScramCredential::generate(m, "hunter2", MIN_ITERATIONS).unwrap();
        assert_ne!(c.salt, again.salt, "salts are random");
        assert_ne!(c.stored_key, again.stored_key);
        assert!(
            !format!("{c:?}").contains("stored_key"),
            "keys never in logs"
        );
    }
    assert_eq!(ScramCredential::check_iterations(4096), Ok(4096));
    assert_eq!(ScramCredential::check_iterations(16384), Ok(16384));
    for bad in [-1, 0, 4095, 16385] {
        assert_eq!(
            ScramCredential::check_iterations(bad),
            Err(ScramError::Iterations(bad))
        );
    }
    for m in ScramMechanism::ALL {
        assert_eq!(ScramMechanism::from_kafka_type(m.kafka_type()), Some(m));
        assert_eq!(ScramMechanism::from_name(m.name()), Some(m));
    }
    assert_eq!(ScramMechanism::from_kafka_type(0), None);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Any user and password authenticate; flipping any bit of the proof
    /// fails the exchange.
    #[test]
    fn round_trip_and_tampered_proofs(
        user in "[a-zA-Z0-9,=_.@-]{1,20}",
        password in ".{0,20}",
        nonce in "[a-zA-Z0-9+/]{8,24}",
        flip in 0usize..512,
        sha512 in any::<bool>(),
    ) {
        let m = if sha512 { ScramMechanism::Sha512 } else { ScramMechanism::Sha256 };
        let cred = ScramCredential::from_password(m, &password, b"salt", MIN_ITERATIONS);
        let c = Client::new(m, &user, &password, &nonce);
        // One server nonce for both exchanges, so both expect the same proof.
        let server = || ScramServer::with_nonce(m, "SRV".into());
        let mut s = server();
        let sf = s.client_first(&c.first(), |u| (u == user).then(|| cred.clone())).unwrap();
        let (cf, expect) = c.last(&sf);
        let (got_user, last) = s.client_final(&cf).unwrap();
        prop_assert_eq!(got_user, user.clone());
        prop_assert_eq!(last, expect);

        let text = String::from_utf8(cf).unwrap();
        let (head, proof) = text.rsplit_once(",p=").unwrap();
        let mut proof = B64.decode(proof).unwrap();
        let bit = flip % (proof.len() * 8);
        proof[bit / 8] ^= 1 << (bit % 8);
        let tampered = format!("{head},p={}", B64.encode(proof));
        let mut s = server();
        s.client_first(&c.first(), |_| Some(cred.clone())).unwrap();
        prop_assert_eq!(s.client_final(tampered.as_bytes()), Err(ScramError::InvalidCredentials(m)));
    }
}

/// librdkafka before 2.x sends `r=` its nonce followed by the server's whole
/// nonce (which starts with its own): Kafka accepts it (`endsWith`), so must
/// we, with the proof computed over what was sent.
#[test]
fn an_old_librdkafka_final_nonce_is_accepted_and_still_proven() {
    let m = ScramMechanism::Sha512;
    let cred = credential(m, "pw");
    let c = Client::new(m, "alice", "pw", "CNONCE");
    let mut s = ScramServer::with_nonce(m, "SNONCE".into());
    let sf = s.client_first(&c.first(), |_| Some(cred.clone())).unwrap();
    // What old librdkafka builds: r = client nonce + server-first's r.
    let sf_text = std::str::from_utf8(&sf).unwrap().to_string();
    let doubled = sf_text.replacen("r=", "r=CNONCE", 1);
    let (cf, _) = c.last(doubled.as_bytes());
    // The proof over the doubled nonce, with the real server-first in the auth message.
    let cf = String::from_utf8(cf).unwrap();
    let without = cf.rsplit_once(",p=").unwrap().0.to_string();
    let salted = m.salted_password(b"pw", b"a fixed salt", MIN_ITERATIONS);
    let client_key = m.hmac(&salted, b"Client Key");
    let auth = format!("n=alice,r=CNONCE,{sf_text},{without}");
    let sig = m.hmac(&m.hash(&client_key), auth.as_bytes());
    let proof: Vec<u8> = client_key.iter().zip(&sig).map(|(a, b)| a ^ b).collect();
    let good = format!("{without},p={}", B64.encode(&proof));
    assert!(without.contains("r=CNONCECNONCESNONCE"), "{without}");
    assert_eq!(s.client_final(good.as_bytes()).unwrap().0, "alice");
    // A nonce that does not end with the server's is still refused.
    let mut s = ScramServer::with_nonce(m, "SNONCE".into());
    s.client_first(&c.first(), |_| Some(cred.clone())).unwrap();
    let bad = good.replace("SNONCE", "SNONCF");
    assert_eq!(s.client_final(bad.as_bytes()), Err(ScramError::Nonce));
}

#[test]
fn the_client_logs_in_and_checks_the_server() {
    for m in ScramMechanism::ALL {
        let cred = credential(m, "pw");
        let mut client = ScramClient::new(m, "a,b=c", "pw").unwrap();
        let mut server = ScramServer::new(m).unwrap();
        let sf = server
            .client_first(&client.first(), |u| (u == "a,b=c").then(|| cred.clone()))
            .unwrap();
        let cf = client.last(&sf).unwrap();
        let (user, last) = server.client_final(&cf).unwrap();
        assert_eq!(user, "a,b=c");
        assert_eq!(client.verify(&last), Ok(()));
        // A server that does not know the credential cannot fake the end.
        assert_eq!(
            client.verify(b"v=AAAA"),
            Err(ScramError::InvalidCredentials(m))
        );
        // A wrong password fails on the server.
        let mut wrong = ScramClient::new(m, "a,b=c", "px").unwrap();
        let mut server = ScramServer::new(m).unwrap();
        let sf = server
            .client_first(&wrong.first(), |_| Some(cred.clone()))
            .unwrap();
        let cf = wrong.last(&sf).unwrap();
        assert_eq!(
            server.client_final(&cf),
            Err(ScramError::InvalidCredentials(m))
        );
    }
    // A server nonce that does not extend ours is refused.
    let mut c = ScramClient::new(ScramMechanism::Sha256, "u", "p").unwrap();
    assert_eq!(c.last(b"r=other,s=c2FsdA==,i=4096"), Err(ScramError::Nonce));
}
