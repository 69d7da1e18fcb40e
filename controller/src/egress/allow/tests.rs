use super::*;

fn parsed(entry: &str) -> Result<String, String> {
    Entry::parse(entry, false)
        .map(|e| e.to_string())
        .map_err(|e| e.to_string())
}

#[test]
fn entries_parse_to_their_normal_form() {
    for (entry, want) in [
        ("example.com", "example.com:443"),
        ("Example.COM", "example.com:443"),
        ("example.com.", "example.com:443"),
        ("example.com:80", "example.com:80"),
        ("example.com:1", "example.com:1"),
        ("example.com:65535", "example.com:65535"),
        ("  api.example.com  ", "api.example.com:443"),
        ("*.example.com", "*.example.com:443"),
        ("*.Example.com.:8443", "*.example.com:8443"),
        ("*.co.uk", "*.co.uk:443"),
        ("bücher.example", "xn--bcher-kva.example:443"),
        ("xn--bcher-kva.example", "xn--bcher-kva.example:443"),
        ("localhost", "localhost:443"),
        ("a-b.c", "a-b.c:443"),
    ] {
        assert_eq!(parsed(entry).as_deref(), Ok(want), "{entry}");
    }
}

#[test]
fn malformed_entries_are_refused_naming_the_entry() {
    for entry in [
        "",
        "   ",
        "example.com:0",
        "example.com:65536",
        "example.com:",
        "example.com:-1",
        "example.com:443x",
        "example.com:+443",
        "https://example.com",
        "example.com/path",
        "exa mple.com",
        "exa_mple.com",
        "-example.com",
        "example-.com",
        "example..com",
        ".example.com",
        "..",
        "*example.com",
        "a.*.example.com",
        "*.*.example.com",
        "example.*",
        "1.2.3.4",
        "1.2.3.4:443",
        "::1",
        "[::1]:443",
        "[2001:db8::1]",
        "user@example.com",
    ] {
        let err = Entry::parse(entry, true).expect_err(entry);
        assert_eq!(err.entry, entry);
        assert!(
            err.to_string().contains(&format!("{entry:?}")),
            "{err} names the entry"
        );
    }
}

#[test]
fn names_and_labels_are_bounded_at_their_edges() {
    let label63 = "a".repeat(63);
    assert!(parsed(&format!("{label63}.com")).is_ok());
    assert!(parsed(&format!("{}.com", "a".repeat(64))).is_err());
    // 4 labels of 61 and their dots: 247; then 253 and 254 in all.
    let label61 = "a".repeat(61);
    let long = [label61.as_str(); 4].join(".");
    assert_eq!(format!("{long}.abcde").len(), 253);
    assert!(parsed(&format!("{long}.abcde")).is_ok(), "253 characters");
    assert!(parsed(&format!("{long}.abcdef")).is_err(), "254 characters");
    // The trailing dot does not count.
    assert!(parsed(&format!("{long}.abcde.")).is_ok());
}

#[test]
fn broad_wildcards_need_allow_any() {
    for entry in ["*", "*.com", "*:80", "*.com:8443", "*.COM."] {
        let err = Entry::parse(entry, false).expect_err(entry);
        assert!(err.why.contains("--egress-allow-any"), "{err}");
        let entry = Entry::parse(entry, true).expect(entry);
        assert!(entry.is_broad());
    }
    assert!(!Entry::parse("*.example.com", false).unwrap().is_broad());
    assert!(!Entry::parse("example.com", false).unwrap().is_broad());
    let list = Allowlist::parse(&["*", "a.example", "*.org"], true).unwrap();
    assert_eq!(list.broad(), vec!["*:443", "*.org:443"]);
}

#[test]
fn a_wildcard_admits_names_below_its_domain_at_any_depth_not_the_domain() {
    let list = Allowlist::parse(&["*.example.com"], false).unwrap();
    assert!(list.admits("a.example.com", 443));
    assert!(list.admits("a.b.example.com", 443));
    assert!(list.admits("A.Example.Com.", 443));
    assert!(!list.admits("example.com", 443));
    assert!(!list.admits("badexample.com", 443));
    assert!(!list.admits("a.example.com.evil.net", 443));
    assert!(!list.admits("a.example.com", 80));
    assert!(!list.admits(".example.com", 443));
}

#[test]
fn an_exact_entry_admits_its_name_and_port_only() {
    let list = Allowlist::parse(&["example.com", "plain.example:80"], false).unwrap();
    assert!(list.admits("example.com", 443));
    assert!(list.admits("EXAMPLE.com.", 443));
    assert!(!list.admits("example.com", 80));
    assert!(!list.admits("www.example.com", 443));
    assert!(list.admits("plain.example", 80));
    assert!(!list.admits("plain.example", 443));
    let unicode = Allowlist::parse(&["bücher.example"], false).unwrap();
    assert!(unicode.admits("xn--bcher-kva.example", 443));
    assert!(unicode.admits("BÜCHER.example", 443));
}

#[test]
fn ip_literals_and_bad_names_are_never_admitted() {
    let list = Allowlist::parse(&["*"], true).unwrap();
    assert!(list.admits("anything.example", 443));
    for host in ["127.0.0.1", "::1", "[::1]", "10.0.0.1", "", "a..b", "a b"] {
        assert!(!list.admits(host, 443), "{host}");
    }
}

#[test]
fn the_empty_list_admits_nothing() {
    let list = Allowlist::parse::<&str>(&[], false).unwrap();
    assert!(list.is_empty());
    assert!(!list.admits("example.com", 443));
}

#[test]
fn the_first_bad_entry_of_a_list_is_the_error() {
    let err = Allowlist::parse(&["ok.example", "bad_name.example", "*"], false).unwrap_err();
    assert_eq!(err.entry, "bad_name.example");
}
