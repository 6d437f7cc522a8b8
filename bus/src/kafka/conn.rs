//! Where the Kafka clients connect and with which extra librdkafka properties (TLS, SASL):
//! one [`KafkaConn`] shared by every client of the service and the agent.

use std::collections::BTreeMap;
use std::fmt;

use rdkafka::config::ClientConfig;

/// Properties gpusanity sets itself: an operator's value would break a guarantee (no event lost
/// or duplicated, offsets committed only after handling) or the wiring (addresses, groups).
pub const OWNED: &[&str] = &[
    "bootstrap.servers",
    "metadata.broker.list",
    "group.id",
    "group.instance.id",
    "group.protocol",
    "enable.auto.commit",
    "auto.commit.interval.ms",
    "enable.auto.offset.store",
    "auto.offset.reset",
    "enable.partition.eof",
    "enable.idempotence",
    "enable.gapless.guarantee",
    "acks",
    "request.required.acks",
    "max.in.flight.requests.per.connection",
    "max.in.flight",
    "transactional.id",
    "isolation.level",
];

/// Secrets that are not taken from the configuration file.
const SECRETS: &[&str] =
    &["sasl.password", "ssl.key.password", "ssl.keystore.password", "ssl.key.pem", "sasl.oauthbearer.client.secret"];

/// SASL mechanisms librdkafka provides as built here (OpenSSL, no Cyrus SASL): no GSSAPI.
const MECHANISMS: &[&str] = &["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"];

/// Why the client properties are refused.
#[derive(Debug, thiserror::Error)]
pub enum PropertyError {
    #[error("kafka.properties: `{0}` is set by gpusanity itself and cannot be configured")]
    Owned(String),
    #[error(
        "kafka.properties: `{0}` is a secret and is not taken from the file (the SASL password comes from \
         GPUSANITY_KAFKA_SASL_PASSWORD or kafka.sasl_password_file)"
    )]
    Secret(String),
    #[error(
        "kafka.properties: SASL mechanism `{0}` is not available (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER)"
    )]
    Mechanism(String),
    #[error("kafka: {0}")]
    Sasl(&'static str),
    #[error("kafka.properties: {0}")]
    Rejected(String),
}

/// The bootstrap servers and the properties every client gets; the SASL password is kept out
/// of `Debug`.
#[derive(Clone, Default, PartialEq)]
pub struct KafkaConn {
    bootstrap: String,
    properties: BTreeMap<String, String>,
    sasl_password: Option<String>,
}

impl fmt::Debug for KafkaConn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaConn")
            .field("bootstrap", &self.bootstrap)
            .field("properties", &self.properties)
            .field("sasl_password", &self.sasl_password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl KafkaConn {
    /// Plaintext, no extra properties.
    pub fn plain(bootstrap: &str) -> KafkaConn {
        KafkaConn { bootstrap: bootstrap.to_string(), ..KafkaConn::default() }
    }

    /// `properties` checked: none that gpusanity owns, no inline secret, a SASL mechanism this
    /// build has with the password it needs, every name and value accepted by librdkafka.
    pub fn new(
        bootstrap: &str,
        properties: BTreeMap<String, String>,
        sasl_password: Option<String>,
    ) -> Result<KafkaConn, PropertyError> {
        for key in properties.keys() {
            let k = key.trim();
            if OWNED.contains(&k) {
                return Err(PropertyError::Owned(k.to_string()));
            }
            if SECRETS.contains(&k) {
                return Err(PropertyError::Secret(k.to_string()));
            }
        }
        let protocol = properties.get("security.protocol").map(|p| p.to_ascii_uppercase()).unwrap_or_default();
        let sasl = protocol.starts_with("SASL_");
        let mechanism = properties.get("sasl.mechanism").or_else(|| properties.get("sasl.mechanisms"));
        if sasl {
            let m = mechanism.map(String::as_str).unwrap_or("GSSAPI");
            if !MECHANISMS.contains(&m) {
                return Err(PropertyError::Mechanism(m.to_string()));
            }
            let needs_password = m != "OAUTHBEARER";
            if needs_password && !properties.contains_key("sasl.username") {
                return Err(PropertyError::Sasl("SASL PLAIN and SCRAM need kafka.properties.\"sasl.username\""));
            }
            if needs_password && sasl_password.is_none() {
                return Err(PropertyError::Sasl(
                    "SASL PLAIN and SCRAM need a password: set GPUSANITY_KAFKA_SASL_PASSWORD or kafka.sasl_password_file",
                ));
            }
        } else if sasl_password.is_some() {
            return Err(PropertyError::Sasl(
                "a SASL password is given but kafka.properties.\"security.protocol\" is not SASL_SSL or SASL_PLAINTEXT",
            ));
        }
        let conn = KafkaConn { bootstrap: bootstrap.to_string(), properties, sasl_password };
        // librdkafka checks every name and value as it takes them.
        conn.client_config().create_native_config().map_err(|e| PropertyError::Rejected(e.to_string()))?;
        Ok(conn)
    }

    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// The security protocol, for logs (`PLAINTEXT` when not set).
    pub fn protocol(&self) -> &str {
        self.properties.get("security.protocol").map(String::as_str).unwrap_or("PLAINTEXT")
    }

    /// A client configuration with the bootstrap servers and every property; the caller adds
    /// what its client needs (those in [`OWNED`]).
    pub fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        for (k, v) in &self.properties {
            c.set(k.trim(), v);
        }
        if let Some(p) = &self.sasl_password {
            c.set("sasl.password", p);
        }
        c.set("bootstrap.servers", &self.bootstrap);
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn owned_secret_and_unknown_properties_are_refused() {
        for k in ["bootstrap.servers", "group.id", "enable.auto.commit", "enable.idempotence", "acks"] {
            let e = KafkaConn::new("k:1", props(&[(k, "x")]), None).unwrap_err();
            assert!(matches!(e, PropertyError::Owned(_)), "{k}: {e}");
        }
        let e = KafkaConn::new("k:1", props(&[("sasl.password", "x")]), None).unwrap_err();
        assert!(matches!(e, PropertyError::Secret(_)), "{e}");
        let e = KafkaConn::new("k:1", props(&[("no.such.property", "1")]), None).unwrap_err();
        assert!(matches!(e, PropertyError::Rejected(_)), "{e}");
        let e = KafkaConn::new("k:1", props(&[("security.protocol", "carrier-pigeon")]), None).unwrap_err();
        assert!(matches!(e, PropertyError::Rejected(_)), "{e}");
    }

    #[test]
    fn sasl_needs_a_built_in_mechanism_a_user_and_a_password() {
        let scram = [("security.protocol", "SASL_SSL"), ("sasl.mechanism", "SCRAM-SHA-512"), ("sasl.username", "u")];
        let c = KafkaConn::new("k:1", props(&scram), Some("pw".into())).unwrap();
        assert_eq!(c.protocol(), "SASL_SSL");
        assert!(!format!("{c:?}").contains("pw\""), "{c:?}");
        assert_eq!(c.client_config().get("sasl.password"), Some("pw"));
        assert_eq!(c.client_config().get("bootstrap.servers"), Some("k:1"));
        assert!(matches!(KafkaConn::new("k:1", props(&scram), None), Err(PropertyError::Sasl(_))));
        let gssapi = [("security.protocol", "SASL_SSL"), ("sasl.username", "u")];
        assert!(matches!(KafkaConn::new("k:1", props(&gssapi), Some("pw".into())), Err(PropertyError::Mechanism(_))));
        assert!(matches!(KafkaConn::new("k:1", props(&[]), Some("pw".into())), Err(PropertyError::Sasl(_))));
        // TLS alone (this build has OpenSSL).
        KafkaConn::new("k:1", props(&[("security.protocol", "SSL")]), None).unwrap();
    }

    #[test]
    fn librdkafka_is_built_with_tls_and_scram() {
        let native = KafkaConn::plain("k:1").client_config().create_native_config().unwrap();
        let features = native.get("builtin.features").unwrap();
        for f in ["ssl", "sasl_plain", "sasl_scram"] {
            assert!(features.split(',').any(|x| x == f), "{f} missing from {features}");
        }
    }
}
