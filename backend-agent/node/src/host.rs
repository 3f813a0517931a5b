//! The host as the agent declares it to Slurm at registration: the address the controller
//! reaches its slurmd at, its name, its CPUs and memory. Real hosts give their own values
//! (`sysconf`); simulated GPUs may declare others (`node --cpus/--memory-mib`), which
//! slurmd then reports as configured (`SlurmdParameters=config_overrides`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// What the agent tells the control plane about its host (`RegisterNode`'s `slurm_*`,
/// `cpus` and `memory_mib`).
#[derive(Clone, Debug, PartialEq)]
pub struct Declared {
    pub address: Ipv4Addr,
    pub hostname: String,
    pub cpus: u32,
    pub memory_mib: u64,
}

impl Declared {
    /// This host's real name, CPUs and memory, at `address`.
    pub fn real(address: Ipv4Addr) -> Declared {
        Declared {
            address,
            hostname: hostname(),
            cpus: cpus(),
            memory_mib: memory_mib(),
        }
    }
}

/// Where the control plane of `url` (`http(s)://HOST:PORT`) is, as an IPv4 socket address;
/// None when the host does not resolve to one.
pub fn control_plane_addr(url: &str) -> Option<SocketAddr> {
    use std::net::ToSocketAddrs;
    let uri: tonic::transport::Uri = url.parse().ok()?;
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    let port = uri
        .port_u16()
        .unwrap_or(if uri.scheme_str() == Some("https") {
            443
        } else {
            80
        });
    (host, port)
        .to_socket_addrs()
        .ok()?
        .find(SocketAddr::is_ipv4)
}

/// The local IPv4 address this host's traffic to `target` leaves from (the kernel's route,
/// asked with an unconnected UDP socket: nothing is sent): the address the control plane's
/// other hosts reach this one at. Loopback when `target` is on this host.
pub fn route_address(target: SocketAddr) -> Option<Ipv4Addr> {
    let probe = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).ok()?;
    probe.connect(target).ok()?;
    match probe.local_addr().ok()?.ip() {
        IpAddr::V4(ip) if !ip.is_unspecified() => Some(ip),
        _ => None,
    }
}

/// The address Slurm should use when `--address` is not given: the host of
/// `--bandwidth-advertise` when it is an IPv4 address, else `--bandwidth-listen`'s when it
/// names one, else loopback.
pub fn default_address(bandwidth_advertise: Option<&str>, listen: SocketAddr) -> Ipv4Addr {
    let advertised = bandwidth_advertise
        .and_then(|a| a.rsplit_once(':'))
        .and_then(|(h, _)| h.parse::<Ipv4Addr>().ok())
        .filter(|ip| !ip.is_unspecified());
    let listening = match listen.ip() {
        IpAddr::V4(ip) if !ip.is_unspecified() => Some(ip),
        _ => None,
    };
    advertised.or(listening).unwrap_or(Ipv4Addr::LOCALHOST)
}

/// The machine's `gethostname`, as it is (Slurm's NodeHostname); `localhost` if unknown.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into a buffer this function owns.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).to_string();
    if ok && !name.is_empty() {
        name
    } else {
        "localhost".into()
    }
}

/// The CPUs online.
pub fn cpus() -> u32 {
    // SAFETY: sysconf only reads system configuration.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    u32::try_from(n).ok().filter(|n| *n > 0).unwrap_or(1)
}

/// Physical memory in MiB, computed as slurmd computes its RealMemory (pages times the
/// page size), so that a real node never declares more than slurmd finds.
pub fn memory_mib() -> u64 {
    // SAFETY: sysconf only reads system configuration.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGE_SIZE),
        )
    };
    match (u64::try_from(pages), u64::try_from(size)) {
        (Ok(p), Ok(s)) => p.saturating_mul(s) / (1024 * 1024),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_control_planes_address_and_the_route_to_it() {
        let cp = control_plane_addr("http://127.0.0.1:7700").unwrap();
        assert_eq!(cp, "127.0.0.1:7700".parse().unwrap());
        assert_eq!(route_address(cp), Some(Ipv4Addr::LOCALHOST));
        assert_eq!(
            control_plane_addr("https://localhost").map(|a| a.port()),
            Some(443)
        );
        assert_eq!(control_plane_addr("not a url"), None);
    }

    #[test]
    fn the_default_address_is_the_advertised_or_listening_one_else_loopback() {
        let listen = |s: &str| s.parse::<SocketAddr>().unwrap();
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        assert_eq!(
            default_address(Some("10.0.0.9:7800"), listen("0.0.0.0:0")),
            ip("10.0.0.9")
        );
        assert_eq!(
            default_address(Some("gpu-9:7800"), listen("10.0.0.8:0")),
            ip("10.0.0.8")
        );
        assert_eq!(default_address(None, listen("0.0.0.0:0")), ip("127.0.0.1"));
        let real = Declared::real(ip("127.0.0.1"));
        assert!(real.cpus >= 1 && real.memory_mib > 0 && !real.hostname.is_empty());
    }
}
