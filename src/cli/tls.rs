//! The TLS flags of `divvy serve`, and envoyproxy/ratelimit's TLS
//! variables read as fallbacks.

use std::path::PathBuf;

use divvy::server::tls::TlsFiles;

/// TLS on the gRPC and admin ports (the line protocol stays plaintext).
#[derive(clap::Args, Debug, Default)]
pub struct TlsArgs {
    /// Serve gRPC over TLS with this certificate chain (PEM; reloaded when
    /// it changes). Fallback: GRPC_SERVER_TLS_CERT with GRPC_SERVER_USE_TLS=true.
    #[arg(long, env = "DIVVY_GRPC_TLS_CERT")]
    grpc_tls_cert: Option<PathBuf>,
    /// The private key of --grpc-tls-cert (PEM). Fallback: GRPC_SERVER_TLS_KEY.
    #[arg(long, env = "DIVVY_GRPC_TLS_KEY")]
    grpc_tls_key: Option<PathBuf>,
    /// Require gRPC clients to present a certificate signed by these CAs
    /// (PEM). Fallback: GRPC_CLIENT_TLS_CACERT or GRPC_SERVER_TLS_CA_CERT.
    #[arg(long, env = "DIVVY_GRPC_TLS_CLIENT_CA")]
    grpc_tls_client_ca: Option<PathBuf>,
    /// With --grpc-tls-client-ca, the client certificate must carry this
    /// subject alternative name (a DNS name, wildcards allowed; an IP address;
    /// or a URI such as a SPIFFE id). Fallback: GRPC_CLIENT_TLS_SAN.
    #[arg(long, env = "DIVVY_GRPC_TLS_CLIENT_SAN")]
    grpc_tls_client_san: Option<String>,
    /// Serve the admin API over TLS (HTTPS) with this certificate chain
    /// (PEM; reloaded when it changes).
    #[arg(long, env = "DIVVY_HTTP_TLS_CERT")]
    http_tls_cert: Option<PathBuf>,
    /// The private key of --http-tls-cert (PEM).
    #[arg(long, env = "DIVVY_HTTP_TLS_KEY")]
    http_tls_key: Option<PathBuf>,
}

/// A TLS setting that cannot be served.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TlsArgsError {
    /// One of a certificate and key was given without the other.
    #[error("{given} is set but {missing} is not: TLS needs both a certificate and its key")]
    Incomplete {
        /// The setting given.
        given: &'static str,
        /// The one missing.
        missing: &'static str,
    },
    /// A client requirement without TLS (or a SAN without a CA).
    #[error("{given} needs {missing}")]
    Needs {
        /// The setting given.
        given: &'static str,
        /// What it needs.
        missing: &'static str,
    },
}

/// The environment as envoyproxy/ratelimit reads it: a variable's value, if any.
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Go's `strconv.ParseBool` true values, as envoyproxy/ratelimit parses
/// GRPC_SERVER_USE_TLS.
fn go_true(value: &str) -> bool {
    matches!(value.trim(), "1" | "t" | "T" | "true" | "TRUE" | "True")
}

/// The first of `names` set to a non-empty value, as a path.
fn first_path(env: Env<'_>, names: &[&str]) -> Option<PathBuf> {
    names
        .iter()
        .filter_map(|n| env(n))
        .find(|v| !v.trim().is_empty())
        .map(|v| PathBuf::from(v.trim()))
}

impl TlsArgs {
    /// The gRPC port's TLS files: the flags, each falling back to
    /// envoyproxy/ratelimit's variable when GRPC_SERVER_USE_TLS is true.
    pub fn grpc(&self, env: Env<'_>) -> Result<Option<TlsFiles>, TlsArgsError> {
        let ratelimit = env("GRPC_SERVER_USE_TLS").is_some_and(|v| go_true(&v));
        let fallback = |names: &[&str]| ratelimit.then(|| first_path(env, names)).flatten();
        let cert = self
            .grpc_tls_cert
            .clone()
            .or_else(|| fallback(&["GRPC_SERVER_TLS_CERT"]));
        let key = self
            .grpc_tls_key
            .clone()
            .or_else(|| fallback(&["GRPC_SERVER_TLS_KEY"]));
        let client_ca = self
            .grpc_tls_client_ca
            .clone()
            .or_else(|| fallback(&["GRPC_CLIENT_TLS_CACERT", "GRPC_SERVER_TLS_CA_CERT"]));
        let client_san = self.grpc_tls_client_san.clone().or_else(|| {
            fallback(&["GRPC_CLIENT_TLS_SAN"]).map(|p| p.to_string_lossy().into_owned())
        });
        let Some((cert, key)) = pair(
            cert,
            key,
            "--grpc-tls-cert (GRPC_SERVER_TLS_CERT)",
            "--grpc-tls-key (GRPC_SERVER_TLS_KEY)",
        )?
        else {
            if client_ca.is_some() {
                return Err(TlsArgsError::Needs {
                    given: "--grpc-tls-client-ca (GRPC_CLIENT_TLS_CACERT)",
                    missing: "--grpc-tls-cert and --grpc-tls-key",
                });
            }
            return Ok(None);
        };
        if client_san.is_some() && client_ca.is_none() {
            return Err(TlsArgsError::Needs {
                given: "--grpc-tls-client-san (GRPC_CLIENT_TLS_SAN)",
                missing: "--grpc-tls-client-ca (GRPC_CLIENT_TLS_CACERT)",
            });
        }
        Ok(Some(TlsFiles {
            cert,
            key,
            client_ca,
            client_san,
        }))
    }

    /// The admin port's TLS files.
    pub fn http(&self) -> Result<Option<TlsFiles>, TlsArgsError> {
        let pair = pair(
            self.http_tls_cert.clone(),
            self.http_tls_key.clone(),
            "--http-tls-cert",
            "--http-tls-key",
        )?;
        Ok(pair.map(|(cert, key)| TlsFiles {
            cert,
            key,
            client_ca: None,
            client_san: None,
        }))
    }
}

/// Both or neither of a certificate and its key.
fn pair(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    cert_name: &'static str,
    key_name: &'static str,
) -> Result<Option<(PathBuf, PathBuf)>, TlsArgsError> {
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some((cert, key))),
        (None, None) => Ok(None),
        (Some(_), None) => Err(TlsArgsError::Incomplete {
            given: cert_name,
            missing: key_name,
        }),
        (None, Some(_)) => Err(TlsArgsError::Incomplete {
            given: key_name,
            missing: cert_name,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    const RATELIMIT: &[(&str, &str)] = &[
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/tls/cert.pem"),
        ("GRPC_SERVER_TLS_KEY", "/tls/key.pem"),
        ("GRPC_SERVER_TLS_CA_CERT", "/tls/gateway-ca.pem"),
        ("GRPC_CLIENT_TLS_SAN", "envoy.example"),
    ];

    #[test]
    fn envoyproxy_ratelimit_variables_are_fallbacks_when_use_tls_is_true() {
        let files = TlsArgs::default().grpc(&env(RATELIMIT)).unwrap().unwrap();
        assert_eq!(files.cert, PathBuf::from("/tls/cert.pem"));
        assert_eq!(files.key, PathBuf::from("/tls/key.pem"));
        assert_eq!(files.client_ca, Some(PathBuf::from("/tls/gateway-ca.pem")));
        assert_eq!(files.client_san.as_deref(), Some("envoy.example"));

        // GRPC_CLIENT_TLS_CACERT comes before Envoy Gateway's name; a flag before both.
        let both: &'static [(&str, &str)] = &[
            ("GRPC_SERVER_USE_TLS", "1"),
            ("GRPC_SERVER_TLS_CERT", "/c"),
            ("GRPC_SERVER_TLS_KEY", "/k"),
            ("GRPC_CLIENT_TLS_CACERT", "/ratelimit-ca"),
            ("GRPC_SERVER_TLS_CA_CERT", "/gateway-ca"),
        ];
        let files = TlsArgs::default().grpc(&env(both)).unwrap().unwrap();
        assert_eq!(files.client_ca, Some(PathBuf::from("/ratelimit-ca")));
        let args = TlsArgs {
            grpc_tls_cert: Some("/flag".into()),
            ..TlsArgs::default()
        };
        let files = args.grpc(&env(both)).unwrap().unwrap();
        assert_eq!(files.cert, PathBuf::from("/flag"));
    }

    #[test]
    fn without_use_tls_the_variables_are_ignored() {
        let off: &'static [(&str, &str)] = &[
            ("GRPC_SERVER_USE_TLS", "false"),
            ("GRPC_SERVER_TLS_CERT", "/c"),
            ("GRPC_SERVER_TLS_KEY", "/k"),
        ];
        assert_eq!(TlsArgs::default().grpc(&env(off)), Ok(None));
        assert_eq!(TlsArgs::default().grpc(&env(&RATELIMIT[1..])), Ok(None));
    }

    #[test]
    fn incomplete_settings_are_errors() {
        let no_key: &'static [(&str, &str)] = &[
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/c"),
        ];
        assert!(matches!(
            TlsArgs::default().grpc(&env(no_key)),
            Err(TlsArgsError::Incomplete { .. })
        ));
        let args = TlsArgs {
            grpc_tls_client_ca: Some("/ca".into()),
            ..TlsArgs::default()
        };
        assert!(matches!(
            args.grpc(&env(&[])),
            Err(TlsArgsError::Needs { .. })
        ));
        let args = TlsArgs {
            grpc_tls_cert: Some("/c".into()),
            grpc_tls_key: Some("/k".into()),
            grpc_tls_client_san: Some("envoy".into()),
            ..TlsArgs::default()
        };
        assert!(matches!(
            args.grpc(&env(&[])),
            Err(TlsArgsError::Needs { .. })
        ));
        let args = TlsArgs {
            http_tls_key: Some("/k".into()),
            ..TlsArgs::default()
        };
        assert!(matches!(args.http(), Err(TlsArgsError::Incomplete { .. })));
    }
}
