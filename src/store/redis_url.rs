//! `--redis-url`: which Redis topology to use and how to reach it.
//!
//! The forms are a contract:
//! - `redis://[user:pass@]host:port[/db]` and `rediss://...` (TLS): one server;
//! - `redis+cluster://[user:pass@]host:port[,host:port...]`: a Cluster, by seed nodes;
//! - `redis+sentinel://[user:pass@]host:port[,host:port...]/<master-name>`: Sentinel,
//!   with `?sentinelUsername=...&sentinelPassword=...` when the Sentinel nodes
//!   have credentials of their own (without them, the data nodes' are offered).
//!
//! `rediss+cluster://` and `rediss+sentinel://` add TLS. User and password
//! may be percent-encoded (a `:` in the user name and any `%` must be); the
//! query's values are form-encoded (`+` is a space). A password
//! may instead come from `REDIS_PASSWORD` (the caller passes it in) so it
//! stays out of command lines.

use thiserror::Error;

/// A Redis host and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    /// Host name or IP address (IPv6 without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
}

/// How the Redis deployment is laid out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// One server, with an optional database number.
    Single {
        /// The server.
        server: HostPort,
        /// `SELECT` this database.
        db: Option<u8>,
    },
    /// A Redis Cluster, discovered from seed nodes.
    Cluster {
        /// Seed nodes.
        seeds: Vec<HostPort>,
    },
    /// A master found and followed through Sentinel.
    Sentinel {
        /// Sentinel nodes.
        sentinels: Vec<HostPort>,
        /// The master's name as Sentinel knows it.
        master: String,
    },
}

/// A parsed `--redis-url`.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisTarget {
    /// Topology and addresses.
    pub topology: Topology,
    /// ACL user name.
    pub username: Option<String>,
    /// Password.
    pub password: Option<String>,
    /// Whether to use TLS.
    pub tls: bool,
    /// Sentinel's own ACL user name (`sentinelUsername`).
    pub sentinel_username: Option<String>,
    /// Sentinel's own password (`sentinelPassword`).
    pub sentinel_password: Option<String>,
}

impl RedisTarget {
    /// The user name and password to offer Sentinel nodes: their own when
    /// the URL gives any, else the data nodes' (a Sentinel without a
    /// password refuses them, and the client carries on unauthenticated).
    pub fn sentinel_credentials(&self) -> (Option<String>, Option<String>) {
        if self.sentinel_username.is_some() || self.sentinel_password.is_some() {
            (
                self.sentinel_username.clone(),
                self.sentinel_password.clone(),
            )
        } else {
            (self.username.clone(), self.password.clone())
        }
    }
}

impl std::fmt::Debug for RedisTarget {
    /// Never prints the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTarget")
            .field("topology", &self.topology)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("tls", &self.tls)
            .field("sentinel_username", &self.sentinel_username)
            .field(
                "sentinel_password",
                &self.sentinel_password.as_ref().map(|_| "***"),
            )
            .finish()
    }
}

/// Why a Redis URL was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RedisUrlError {
    /// The text is not one of the accepted forms.
    #[error("invalid Redis URL: {0} (expected redis://host:port[/db], rediss://..., redis+cluster://host:port[,host:port...] or redis+sentinel://host:port[,host:port...]/master-name)")]
    Invalid(String),
}

fn invalid(msg: impl Into<String>) -> RedisUrlError {
    RedisUrlError::Invalid(msg.into())
}

/// Parses `url`; `password_env` (from `REDIS_PASSWORD`) is used when the URL has no password.
pub fn parse_redis_url(
    url: &str,
    password_env: Option<String>,
) -> Result<RedisTarget, RedisUrlError> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| invalid(format!("`{url}` has no scheme")))?;
    let (kind, tls) = match scheme {
        "redis" => ("single", false),
        "rediss" => ("single", true),
        "redis+cluster" => ("cluster", false),
        "rediss+cluster" => ("cluster", true),
        "redis+sentinel" => ("sentinel", false),
        "rediss+sentinel" => ("sentinel", true),
        other => return Err(invalid(format!("unknown scheme `{other}`"))),
    };
    let (userinfo, rest) = match rest.rsplit_once('@') {
        Some((u, r)) => (Some(u), r),
        None => (None, rest),
    };
    let (username, password) = credentials(userinfo, password_env)?;
    // Only a Sentinel URL takes a query (its nodes' own credentials); it is
    // never repeated in an error, since it may hold a password.
    let (rest, query) = match rest.split_once('?') {
        Some(_) if kind != "sentinel" => {
            return Err(invalid("only a Sentinel URL takes a query"));
        }
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (sentinel_username, sentinel_password) = sentinel_query(query)?;
    let (hosts, path) = match rest.split_once('/') {
        Some((h, p)) => (h, Some(p)),
        None => (rest, None),
    };
    let default_port = if kind == "sentinel" { 26379 } else { 6379 };
    let servers = hosts
        .split(',')
        .map(|h| parse_host_port(h, default_port))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(RedisTarget {
        topology: topology(kind, servers, path)?,
        username,
        password,
        tls,
        sentinel_username,
        sentinel_password,
    })
}

/// `sentinelUsername` and `sentinelPassword` from a Sentinel URL's query
/// (form-decoded: `+` is a space, as fred reads the same parameters); any
/// other parameter is refused.
fn sentinel_query(query: Option<&str>) -> Result<(Option<String>, Option<String>), RedisUrlError> {
    let (mut username, mut password) = (None, None);
    for pair in query.into_iter().flat_map(|q| q.split('&')) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(&value.replace('+', " "))
            .map_err(|_| invalid("bad percent-encoding in the Sentinel credentials"))?;
        let value = Some(value).filter(|v| !v.is_empty());
        match key {
            "sentinelUsername" => username = value,
            "sentinelPassword" => password = value,
            _ => {
                return Err(invalid(
                    "a Sentinel URL's query takes sentinelUsername and sentinelPassword only",
                ))
            }
        }
    }
    Ok((username, password))
}

/// The user name and password of a URL's `userinfo` (percent-decoded);
/// `password_env` when the URL has no password.
fn credentials(
    userinfo: Option<&str>,
    password_env: Option<String>,
) -> Result<(Option<String>, Option<String>), RedisUrlError> {
    let (mut username, mut password) = (None, None);
    if let Some(info) = userinfo {
        let (u, p) = match info.split_once(':') {
            Some((u, p)) => (u, Some(p)),
            None => ("", Some(info)),
        };
        if !u.is_empty() {
            username = Some(percent_decode(u)?);
        }
        password = p
            .filter(|p| !p.is_empty())
            .map(percent_decode)
            .transpose()?;
    }
    if password.is_none() {
        password = password_env.filter(|p| !p.is_empty());
    }
    Ok((username, password))
}

/// The servers of a URL of `kind` (single, cluster, sentinel) and its
/// path: a single server's database, a sentinel's master name.
fn topology(
    kind: &str,
    servers: Vec<HostPort>,
    path: Option<&str>,
) -> Result<Topology, RedisUrlError> {
    Ok(match kind {
        "single" => {
            let [server] = <[HostPort; 1]>::try_from(servers)
                .map_err(|_| invalid("a single-server URL names exactly one host"))?;
            let db = match path.filter(|p| !p.is_empty()) {
                None => None,
                Some(p) => Some(p.parse::<u8>().map_err(|_| {
                    invalid(format!("database `{p}` is not a number from 0 to 255"))
                })?),
            };
            Topology::Single { server, db }
        }
        "cluster" => {
            if path.is_some_and(|p| !p.is_empty()) {
                return Err(invalid("a cluster URL takes no path"));
            }
            Topology::Cluster { seeds: servers }
        }
        _ => {
            let master = path
                .filter(|p| !p.is_empty())
                .ok_or_else(|| invalid("a sentinel URL ends with /<master-name>"))?;
            Topology::Sentinel {
                sentinels: servers,
                master: percent_decode(master)?,
            }
        }
    })
}

fn parse_host_port(text: &str, default_port: u16) -> Result<HostPort, RedisUrlError> {
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| invalid(format!("`{text}`: unclosed `[`")))?;
        match after.strip_prefix(':') {
            Some(p) => (host, Some(p)),
            None if after.is_empty() => (host, None),
            None => return Err(invalid(format!("`{text}` is not host:port"))),
        }
    } else {
        match text.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (text, None),
        }
    };
    if host.is_empty() {
        return Err(invalid(format!("`{text}` has no host")));
    }
    let port = match port {
        None => default_port,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| invalid(format!("`{p}` is not a port number")))?,
    };
    Ok(HostPort {
        host: host.to_owned(),
        port,
    })
}

fn percent_decode(s: &str) -> Result<String, RedisUrlError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| invalid("bad percent-encoding in the user or password"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| invalid("the user or password is not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hp(host: &str, port: u16) -> HostPort {
        HostPort {
            host: host.into(),
            port,
        }
    }

    #[test]
    fn single_server_forms() {
        let t = parse_redis_url("redis://127.0.0.1:6380/2", None).unwrap();
        assert_eq!(
            t.topology,
            Topology::Single {
                server: hp("127.0.0.1", 6380),
                db: Some(2)
            }
        );
        assert!(!t.tls && t.password.is_none());
        let t = parse_redis_url("rediss://user:p%40ss@[::1]:7000", None).unwrap();
        assert!(t.tls);
        assert_eq!(t.username.as_deref(), Some("user"));
        assert_eq!(t.password.as_deref(), Some("p@ss"));
        assert_eq!(
            t.topology,
            Topology::Single {
                server: hp("::1", 7000),
                db: None
            }
        );
        let t = parse_redis_url("redis://localhost", Some("envpw".into())).unwrap();
        assert_eq!(t.password.as_deref(), Some("envpw"));
        let t = parse_redis_url("redis://:urlpw@localhost", Some("envpw".into())).unwrap();
        assert_eq!(t.password.as_deref(), Some("urlpw"));
        assert!(!format!("{t:?}").contains("urlpw"));
        // `?` and `@` in a password need no encoding: the last `@` ends it.
        let t = parse_redis_url("redis+sentinel://:p?w@d@h/m?sentinelPassword=s", None).unwrap();
        assert_eq!(t.password.as_deref(), Some("p?w@d"));
        assert_eq!(t.sentinel_password.as_deref(), Some("s"));
    }

    #[test]
    fn cluster_and_sentinel_forms() {
        let t = parse_redis_url("redis+cluster://a:1,b:2,[::1]:3", None).unwrap();
        assert_eq!(
            t.topology,
            Topology::Cluster {
                seeds: vec![hp("a", 1), hp("b", 2), hp("::1", 3)]
            }
        );
        let t = parse_redis_url("redis+sentinel://:pw@s1:26379,s2/mymaster", None).unwrap();
        assert_eq!(
            t.topology,
            Topology::Sentinel {
                sentinels: vec![hp("s1", 26379), hp("s2", 26379)],
                master: "mymaster".into()
            }
        );
        assert_eq!(t.password.as_deref(), Some("pw"));
        assert_eq!(t.sentinel_credentials(), (None, Some("pw".into())));
    }

    #[test]
    fn sentinel_credentials_of_their_own() {
        let url = "redis+sentinel://:pw@s1/m?sentinelUsername=sen&sentinelPassword=p%40ss%2B+x";
        let t = parse_redis_url(url, None).unwrap();
        assert_eq!(
            t.topology,
            Topology::Sentinel {
                sentinels: vec![hp("s1", 26379)],
                master: "m".into()
            }
        );
        assert_eq!(t.password.as_deref(), Some("pw"));
        assert_eq!(
            t.sentinel_credentials(),
            (Some("sen".into()), Some("p@ss+ x".into()))
        );
        assert!(!format!("{t:?}").contains("p@ss"), "{t:?}");
        let t = parse_redis_url("redis+sentinel://s1/m?sentinelPassword=only", None).unwrap();
        assert_eq!(t.sentinel_credentials(), (None, Some("only".into())));
        for bad in [
            "redis+sentinel://s1/m?password=secret",
            "redis+sentinel://s1/m?sentinelPassword=%zzsecret",
            "redis+sentinel://s1:26379?sentinelPassword=secret",
            "redis://h/0?sentinelPassword=secret",
            "redis+cluster://h?sentinelPassword=secret",
        ] {
            let e = parse_redis_url(bad, None).expect_err(bad).to_string();
            assert!(!e.contains("secret"), "{bad}: the error repeats it: {e}");
        }
    }

    #[test]
    fn bad_urls() {
        for bad in [
            "localhost:6379",
            "http://x",
            "redis://a:1,b:2",
            "redis://host:0",
            "redis://host:99999",
            "redis://host/300",
            "redis+sentinel://s1:26379",
            "redis+cluster://a:1/x",
            "redis://:",
            "redis://%zz@h",
        ] {
            assert!(parse_redis_url(bad, None).is_err(), "{bad}");
        }
    }
}
