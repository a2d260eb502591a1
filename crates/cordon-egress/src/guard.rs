//! The address guard: which resolved addresses a sandbox may never reach unless an allow
//! entry names their range explicitly.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an address is special (non-public). `None` from [`classify`] means public unicast.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressClass {
    /// 0.0.0.0/8, `::`
    Unspecified,
    /// 127.0.0.0/8, `::1`
    Loopback,
    /// RFC 1918: 10/8, 172.16/12, 192.168/16
    Private,
    /// 169.254/16 (the cloud metadata address 169.254.169.254 among them), fe80::/10
    LinkLocal,
    /// 100.64/10 carrier-grade NAT
    Cgnat,
    /// 224/4, ff00::/8
    Multicast,
    /// 240/4 and 255.255.255.255
    Reserved,
    /// 192.0.0/24, 198.18/15 and other special-purpose IPv4 blocks
    SpecialPurpose,
    /// TEST-NET and 2001:db8::/32 documentation ranges
    Documentation,
    /// fc00::/7 unique local
    UniqueLocal,
    /// ::ffff:0:0/96 IPv4-mapped, ::/96 IPv4-compatible
    Ipv4Mapped,
    /// 64:ff9b::/96 and 64:ff9b:1::/48 NAT64, 2002::/16 6to4, 2001::/32 Teredo: they embed
    /// an IPv4 address the guard cannot vouch for.
    Translated,
    /// One of this machine's own interface addresses (its public address among them): the
    /// proxy runs in the host's network namespace, so it would reach the host's services.
    HostOwn,
}

impl AddressClass {
    /// Short name used in audit rules (`address-guard:<name>`).
    pub fn as_str(self) -> &'static str {
        match self {
            AddressClass::Unspecified => "unspecified",
            AddressClass::Loopback => "loopback",
            AddressClass::Private => "private",
            AddressClass::LinkLocal => "link-local",
            AddressClass::Cgnat => "cgnat",
            AddressClass::Multicast => "multicast",
            AddressClass::Reserved => "reserved",
            AddressClass::SpecialPurpose => "special-purpose",
            AddressClass::Documentation => "documentation",
            AddressClass::UniqueLocal => "unique-local",
            AddressClass::Ipv4Mapped => "ipv4-mapped",
            AddressClass::Translated => "ipv4-translated",
            AddressClass::HostOwn => "host-own",
        }
    }
}

/// Classifies an address; `None` means ordinary public unicast that the guard lets through.
/// This machine's own addresses count as non-public whatever their range.
pub fn classify(ip: IpAddr) -> Option<AddressClass> {
    let c = match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    };
    c.or_else(|| is_host_address(ip).then_some(AddressClass::HostOwn))
}

/// Every non-public range, for checking whole CIDR entries (see [`non_public_overlap`]).
const NON_PUBLIC: &[(&str, AddressClass)] = &[
    ("0.0.0.0/8", AddressClass::Unspecified),
    ("127.0.0.0/8", AddressClass::Loopback),
    ("10.0.0.0/8", AddressClass::Private),
    ("172.16.0.0/12", AddressClass::Private),
    ("192.168.0.0/16", AddressClass::Private),
    ("169.254.0.0/16", AddressClass::LinkLocal),
    ("100.64.0.0/10", AddressClass::Cgnat),
    ("224.0.0.0/4", AddressClass::Multicast),
    ("240.0.0.0/4", AddressClass::Reserved),
    ("192.0.0.0/24", AddressClass::SpecialPurpose),
    ("198.18.0.0/15", AddressClass::SpecialPurpose),
    ("192.0.2.0/24", AddressClass::Documentation),
    ("198.51.100.0/24", AddressClass::Documentation),
    ("203.0.113.0/24", AddressClass::Documentation),
    // IPv6: everything outside 2000::/3, and the special blocks inside it
    ("::/3", AddressClass::Reserved),
    ("4000::/2", AddressClass::Reserved),
    ("8000::/1", AddressClass::Reserved),
    ("2001::/32", AddressClass::Translated),
    ("2001:db8::/32", AddressClass::Documentation),
    ("2002::/16", AddressClass::Translated),
];

/// The first non-public range `net` overlaps (or this machine's own address it contains):
/// a CIDR entry that reaches into one is not a public entry, whatever its size
/// (`0.0.0.0/0` contains loopback and the metadata address).
pub fn non_public_overlap(net: &ipnet::IpNet) -> Option<AddressClass> {
    for (range, class) in NON_PUBLIC {
        let Ok(r) = range.parse::<ipnet::IpNet>() else {
            continue;
        };
        if r.contains(&net.network()) || net.contains(&r.network()) {
            return Some(*class);
        }
    }
    host_addresses()
        .into_iter()
        .any(|ip| net.contains(&ip))
        .then_some(AddressClass::HostOwn)
}

/// How long the list of this machine's addresses is trusted before it is read again.
const HOST_ADDRS_TTL: std::time::Duration = std::time::Duration::from_secs(10);

static HOST_ADDRS: std::sync::Mutex<Option<(std::time::Instant, Vec<IpAddr>)>> =
    std::sync::Mutex::new(None);

/// This machine's interface addresses (read at most every 10 s).
pub fn host_addresses() -> Vec<IpAddr> {
    let mut slot = HOST_ADDRS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((at, addrs)) = slot.as_ref()
        && at.elapsed() < HOST_ADDRS_TTL
    {
        return addrs.clone();
    }
    let addrs: Vec<IpAddr> = nix::ifaddrs::getifaddrs()
        .map(|it| {
            it.filter_map(|i| i.address)
                .filter_map(|a| {
                    a.as_sockaddr_in()
                        .map(|s| IpAddr::V4(s.ip()))
                        .or_else(|| a.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip())))
                })
                .collect()
        })
        .unwrap_or_default();
    *slot = Some((std::time::Instant::now(), addrs.clone()));
    addrs
}

/// True if `ip` is one of this machine's interface addresses.
pub fn is_host_address(ip: IpAddr) -> bool {
    host_addresses().contains(&ip)
}

fn classify_v4(ip: Ipv4Addr) -> Option<AddressClass> {
    let o = ip.octets();
    let c = match o {
        [0, ..] => AddressClass::Unspecified,
        [127, ..] => AddressClass::Loopback,
        [10, ..] => AddressClass::Private,
        [172, b, ..] if (16..=31).contains(&b) => AddressClass::Private,
        [192, 168, ..] => AddressClass::Private,
        [169, 254, ..] => AddressClass::LinkLocal,
        [100, b, ..] if (64..=127).contains(&b) => AddressClass::Cgnat,
        [a, ..] if (224..=239).contains(&a) => AddressClass::Multicast,
        [a, ..] if a >= 240 => AddressClass::Reserved,
        [192, 0, 0, _] => AddressClass::SpecialPurpose,
        [198, b, ..] if b == 18 || b == 19 => AddressClass::SpecialPurpose,
        [192, 0, 2, _] | [198, 51, 100, _] | [203, 0, 113, _] => AddressClass::Documentation,
        _ => return None,
    };
    Some(c)
}

fn classify_v6(ip: Ipv6Addr) -> Option<AddressClass> {
    let s = ip.segments();
    if ip.is_unspecified() {
        return Some(AddressClass::Unspecified);
    }
    if ip.is_loopback() {
        return Some(AddressClass::Loopback);
    }
    // ::ffff:a.b.c.d (mapped) and ::a.b.c.d (deprecated compatible form)
    if s[..5] == [0, 0, 0, 0, 0] && (s[5] == 0xffff || s[5] == 0) {
        return Some(AddressClass::Ipv4Mapped);
    }
    let c = match s[0] {
        x if x & 0xfe00 == 0xfc00 => AddressClass::UniqueLocal,
        x if x & 0xffc0 == 0xfe80 => AddressClass::LinkLocal,
        // fec0::/10 site-local (deprecated) is as internal as link-local
        x if x & 0xffc0 == 0xfec0 => AddressClass::LinkLocal,
        x if x & 0xff00 == 0xff00 => AddressClass::Multicast,
        0x0064 if s[1] == 0xff9b => AddressClass::Translated,
        0x2002 => AddressClass::Translated,
        0x2001 if s[1] == 0 => AddressClass::Translated,
        0x2001 if s[1] == 0x0db8 => AddressClass::Documentation,
        // 100::/64 discard-only
        0x0100 if s[1..4] == [0, 0, 0] => AddressClass::Reserved,
        // everything outside 2000::/3 is not global unicast
        x if x & 0xe000 != 0x2000 => AddressClass::Reserved,
        _ => return None,
    };
    Some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Option<AddressClass> {
        classify(s.parse().unwrap())
    }

    #[test]
    fn special_ranges_are_classified() {
        use AddressClass::*;
        let cases = [
            ("0.0.0.0", Unspecified),
            ("0.1.2.3", Unspecified),
            ("127.0.0.1", Loopback),
            ("127.255.255.254", Loopback),
            ("10.1.2.3", Private),
            ("172.16.0.1", Private),
            ("172.31.255.255", Private),
            ("192.168.1.1", Private),
            ("169.254.169.254", LinkLocal),
            ("100.64.0.1", Cgnat),
            ("100.127.255.255", Cgnat),
            ("224.0.0.1", Multicast),
            ("239.255.255.250", Multicast),
            ("240.0.0.1", Reserved),
            ("255.255.255.255", Reserved),
            ("192.0.0.8", SpecialPurpose),
            ("198.18.0.1", SpecialPurpose),
            ("192.0.2.1", Documentation),
            ("::", Unspecified),
            ("::1", Loopback),
            ("::ffff:127.0.0.1", Ipv4Mapped),
            ("::ffff:8.8.8.8", Ipv4Mapped),
            ("::127.0.0.1", Ipv4Mapped),
            ("fc00::1", UniqueLocal),
            ("fd12:3456::1", UniqueLocal),
            ("fe80::1", LinkLocal),
            ("febf::1", LinkLocal),
            ("ff02::1", Multicast),
            ("64:ff9b::a9fe:a9fe", Translated),
            ("2002:7f00:1::1", Translated),
            ("2001:0:1::1", Translated),
            ("2001:db8::1", Documentation),
            ("100::1", Reserved),
        ];
        for (ip, want) in cases {
            assert_eq!(c(ip), Some(want), "{ip}");
        }
    }

    #[test]
    fn public_addresses_pass() {
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "172.15.255.255",
            "172.32.0.1",
            "100.63.255.255",
            "100.128.0.1",
            "169.253.1.1",
            "192.169.0.1",
            "2606:4700::1111",
            "2a00:1450::1",
        ] {
            assert_eq!(c(ip), None, "{ip}");
        }
    }

    #[test]
    fn cidrs_reaching_into_non_public_ranges_are_caught() {
        let o = |s: &str| non_public_overlap(&s.parse().unwrap());
        assert_eq!(o("0.0.0.0/0"), Some(AddressClass::Unspecified));
        assert_eq!(o("127.0.0.1/32"), Some(AddressClass::Loopback));
        assert_eq!(o("169.254.169.254/32"), Some(AddressClass::LinkLocal));
        assert_eq!(o("10.1.0.0/16"), Some(AddressClass::Private));
        assert_eq!(o("8.0.0.0/6"), Some(AddressClass::Private));
        assert_eq!(o("::/0"), Some(AddressClass::Reserved));
        assert_eq!(o("fd00::/8"), Some(AddressClass::Reserved));
        assert_eq!(o("8.8.8.0/24"), None);
        assert_eq!(o("2606:4700::/32"), None);
    }

    #[test]
    fn this_machines_own_addresses_are_not_public() {
        let own = host_addresses();
        assert!(own.iter().any(|ip| ip.is_loopback()), "{own:?}");
        for ip in own {
            assert!(classify(ip).is_some(), "{ip} passed the guard");
            assert!(
                non_public_overlap(&ipnet::IpNet::from(ip)).is_some(),
                "{ip}"
            );
        }
    }
}
