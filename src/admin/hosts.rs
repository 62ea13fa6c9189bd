//! The names the admin server answers under, and the origins it takes changes from.
//!
//! A browser sends whatever name its page was loaded from as the `Host` of a request. A page
//! on `evil.example` whose name is made to resolve to 127.0.0.1 (DNS rebinding) is, for the
//! browser, same-origin with a server on loopback: without this check its script could read
//! every pool. So the server answers only the names it is known by: its bound address,
//! `localhost`, and the names the operator lists (`allowed_hosts`). A change sent with an
//! `Origin` must come from a page served under one of those names too.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The `Host` values the server answers: exact `host:port` forms, and names that are served
/// bare or with the bound port.
#[derive(Debug, Clone)]
pub(crate) struct ServedHosts {
    /// `Host` values taken as they are, lowercased: `127.0.0.1:7480`, `[::1]:7480`, and the
    /// listed names that carry a port.
    exact: Vec<String>,
    /// Names taken bare or followed by the bound port, lowercased: `localhost` and the listed
    /// names without a port.
    names: Vec<String>,
    /// The bound port.
    port: u16,
}

impl ServedHosts {
    /// The names of a server bound to `addr` that also answers `allowed` (entries as
    /// `admin.allowed_hosts` holds them: `name` or `name:port`, checked beforehand).
    pub(crate) fn new(addr: SocketAddr, allowed: &[String]) -> Self {
        let port = addr.port();
        let mut exact = vec![addr.to_string()];
        // Bound to every address, the server is reached on loopback by its loopback address.
        match addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => {
                exact.push(SocketAddr::from((Ipv4Addr::LOCALHOST, port)).to_string());
            }
            IpAddr::V6(ip) if ip.is_unspecified() => {
                exact.push(SocketAddr::from((Ipv6Addr::LOCALHOST, port)).to_string());
                exact.push(SocketAddr::from((Ipv4Addr::LOCALHOST, port)).to_string());
            }
            _ => {}
        }
        let mut names = vec!["localhost".to_owned()];
        for entry in allowed {
            let entry = entry.to_ascii_lowercase();
            if has_port(&entry) {
                exact.push(entry);
            } else {
                names.push(entry);
            }
        }
        Self { exact, names, port }
    }

    /// Whether a request with this `Host` is answered.
    pub(crate) fn serves(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        if self.exact.contains(&host) {
            return true;
        }
        let port = format!(":{}", self.port);
        let bare = host.strip_suffix(&port).unwrap_or(&host);
        self.names.iter().any(|name| name == bare)
    }

    /// Whether a change sent with this `Origin` comes from a page of a served name:
    /// `http://` or `https://` and a served host, nothing else (`null` included).
    pub(crate) fn serves_origin(&self, origin: &str) -> bool {
        let host = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"));
        host.is_some_and(|host| !host.contains('/') && self.serves(host))
    }

    /// The forms served, for a message: `127.0.0.1:7480, localhost:7480, ...`.
    pub(crate) fn listed(&self) -> String {
        let with_port = self
            .names
            .iter()
            .map(|name| format!("{name}:{}", self.port));
        self.exact
            .iter()
            .cloned()
            .chain(with_port)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Whether a `Host` form ends with a port: `name:80`, `[::1]:80` (not `[::1]`).
fn has_port(host: &str) -> bool {
    match host.rsplit_once(']') {
        Some((_, rest)) => rest.starts_with(':'),
        None => host.contains(':'),
    }
}

#[cfg(test)]
mod tests {
    use super::ServedHosts;

    #[test]
    fn the_bound_address_localhost_and_listed_names_are_served() {
        let allowed = ["Dash.Example.com".to_owned(), "proxy.lan:8443".to_owned()];
        let hosts = ServedHosts::new("127.0.0.1:7480".parse().unwrap(), &allowed);
        for host in [
            "127.0.0.1:7480",
            "localhost",
            "LOCALHOST:7480",
            "dash.example.com",
            "dash.example.com:7480",
            "proxy.lan:8443",
        ] {
            assert!(hosts.serves(host), "{host}");
        }
        for host in [
            "evil.example:7480",
            "127.0.0.1:7481",
            "127.0.0.1",
            "localhost:80",
            "proxy.lan",
            "dash.example.com.evil:7480",
            "",
        ] {
            assert!(!hosts.serves(host), "{host}");
        }
        assert!(hosts.serves_origin("http://127.0.0.1:7480"));
        assert!(hosts.serves_origin("https://dash.example.com"));
        assert!(!hosts.serves_origin("http://evil.example:7480"));
        assert!(!hosts.serves_origin("null"));
        assert!(!hosts.serves_origin("http://localhost:7480/x"));
    }

    #[test]
    fn bound_to_every_address_loopback_is_served() {
        let hosts = ServedHosts::new("[::]:7480".parse().unwrap(), &[]);
        assert!(hosts.serves("[::1]:7480"));
        assert!(hosts.serves("127.0.0.1:7480"));
        assert!(!hosts.serves("evil.example:7480"));
        let hosts = ServedHosts::new("[::1]:7480".parse().unwrap(), &[]);
        assert!(hosts.serves("[::1]:7480"));
        assert!(hosts.listed().contains("[::1]:7480"));
    }
}
