//! The chart's egress proxy (`pool.egress.allow`), evaluated the way a
//! CNI would: each NetworkPolicy against the labels of the Pods the chart
//! and the controller make, and its ipBlocks against addresses. With an
//! allowlist, sandboxes reach exactly the api's sandbox port, DNS and the
//! proxy's port; the proxy takes connections only from its pool's sandbox
//! Pods (and scrapers on its metrics port) and reaches only DNS, the
//! Kubernetes API and the allowlist's ports at public addresses. Without
//! one, nothing of the proxy renders.

use super::*;
use k8s_openapi::api::networking::v1::NetworkPolicyEgressRule;
use std::net::IpAddr;

const PROXY: &str = "mango-egress";

/// Default values plus a pool with an allowlist (`Renders::egress`).
pub(super) fn values() -> Value {
    json!({"pool": {
        "enabled": true,
        "environmentId": "env_1",
        "environmentKeySecret": {"name": "pool-key"},
        "egress": {"allow": ["example.com", "*.example.org:8443", "Bücher.example:443"]},
    }})
}

/// The renders with an allowlist: (name, release, allowPrivate).
fn with_allow(r: &Renders) -> [(&'static str, &Release, bool); 2] {
    [("egress", &r.egress, false), ("full", &r.full, true)]
}

/// Every object of the proxy, by kind: none may render without an allowlist.
pub(super) fn assert_no_proxy(name: &str, release: &Release) {
    let proxy_objects: Vec<&str> = release
        .docs
        .iter()
        .filter(|d| {
            d.source.contains("/templates/egress/")
                || serde_yaml::from_str::<Value>(&d.yaml).unwrap()["metadata"]["name"] == PROXY
        })
        .map(|d| d.source.as_str())
        .collect();
    assert!(proxy_objects.is_empty(), "{name}: {proxy_objects:?}");
    for pool in all_of!(release, WorkerPool) {
        let spec = &serde_json::to_value(pool).unwrap()["spec"];
        assert!(spec.get("egress").is_none(), "{name}: no spec.egress");
    }
}

fn pool_yaml(release: &Release) -> Value {
    let docs: Vec<Value> = release
        .docs
        .iter()
        .filter(|d| matches!(d.object, Object::WorkerPool(_)))
        .map(|d| serde_yaml::from_str(&d.yaml).unwrap())
        .collect();
    assert_eq!(docs.len(), 1, "one WorkerPool");
    docs[0].clone()
}

/// `(protocol, port)`s of a rule; `None`: every port.
fn rule_ports(ports: &Option<Vec<NetworkPolicyPort>>) -> Option<BTreeSet<(String, i32)>> {
    ports
        .as_ref()
        .filter(|p| !p.is_empty())
        .map(|p| p.iter().map(port).collect())
}

/// Which of `pods` (name, labels) an egress or ingress peer list admits,
/// for peers in the policy's own namespace (a podSelector alone).
fn same_namespace_pods<'a>(
    peers: &[NetworkPolicyPeer],
    pods: &'a [(String, BTreeMap<String, String>)],
) -> BTreeSet<&'a str> {
    pods.iter()
        .filter(|(_, labels)| {
            peers.iter().any(|p| {
                p.namespace_selector.is_none()
                    && p.ip_block.is_none()
                    && p.pod_selector.as_ref().is_some_and(|s| selects(s, labels))
            })
        })
        .map(|(name, _)| name.as_str())
        .collect()
}

fn in_cidr(ip: IpAddr, cidr: &str) -> bool {
    let (net, len) = cidr.split_once('/').expect("a CIDR");
    let len: u32 = len.parse().expect("a prefix length");
    match (ip, net.parse::<IpAddr>().expect("a network address")) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// Whether an egress rule lets TCP to `ip:port` out, by its ipBlocks.
fn rule_admits_address(rule: &NetworkPolicyEgressRule, ip: IpAddr, tcp_port: i32) -> bool {
    let port_ok =
        rule_ports(&rule.ports).is_none_or(|ports| ports.contains(&("TCP".to_string(), tcp_port)));
    port_ok
        && rule.to.iter().flatten().any(|peer| {
            peer.ip_block.as_ref().is_some_and(|b| {
                in_cidr(ip, &b.cidr) && !b.except.iter().flatten().any(|e| in_cidr(ip, e))
            })
        })
}

fn workload_labels(release: &Release) -> Vec<(String, BTreeMap<String, String>)> {
    workload_pods(release)
        .into_iter()
        .map(|(name, t)| (name, labels_of(&t)))
        .collect()
}

/// The proxy Pods' named port of its container.
fn container_port(release: &Release, name: &str) -> i32 {
    let d = named!(release, Deployment, PROXY);
    pod_spec(template(d)).containers[0]
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("the proxy's {name} port"))
        .container_port
}

/// With an allowlist the sandboxes reach exactly three things: the api
/// Pods' sandbox port, DNS, and the proxy Pods' port, which is the port
/// of the Service the WorkerPool names as its proxy.
#[test]
fn with_an_allowlist_sandboxes_reach_exactly_the_api_dns_and_the_proxy() {
    let Some(r) = renders() else { return };
    for (name, release, _) in with_allow(r) {
        let policy = named!(release, NetworkPolicy, "mango-sandbox");
        let spec = policy.spec.as_ref().unwrap();
        assert!(spec.ingress.as_ref().is_none_or(|i| i.is_empty()), "{name}");
        let pool = all_of!(release, WorkerPool)[0];
        for sandbox in sandbox_pods(pool) {
            let labels = sandbox.metadata.labels.clone().unwrap();
            assert!(selects(spec.pod_selector.as_ref().unwrap(), &labels));
        }

        let pods = workload_labels(release);
        let api_port = pod_spec(template(named!(release, Deployment, "mango-api"))).containers[0]
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some("sandbox"))
            .unwrap()
            .container_port;
        let proxy_port = container_port(release, "proxy");
        let dns = [NetworkPolicyPeer {
            namespace_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    "kubernetes.io/metadata.name".into(),
                    "kube-system".into(),
                )])),
                match_expressions: None,
            }),
            pod_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([("k8s-app".into(), "kube-dns".into())])),
                match_expressions: None,
            }),
            ip_block: None,
        }];
        let mut reached = BTreeSet::new();
        let mut dns_rules = 0;
        for rule in spec.egress.iter().flatten() {
            let peers = rule.to.clone().unwrap_or_default();
            assert!(!peers.is_empty(), "{name}: a rule to every destination");
            let ports = rule_ports(&rule.ports).expect("a rule to every port");
            if peers == dns {
                assert_eq!(
                    ports,
                    BTreeSet::from([("TCP".to_string(), 53), ("UDP".to_string(), 53)])
                );
                dns_rules += 1;
                continue;
            }
            assert!(
                peers
                    .iter()
                    .all(|p| p.ip_block.is_none() && p.namespace_selector.is_none()),
                "{name}: only Pods of the release's namespace besides DNS: {peers:?}"
            );
            for pod in same_namespace_pods(&peers, &pods) {
                for (protocol, number) in &ports {
                    reached.insert((pod.to_string(), protocol.clone(), *number));
                }
            }
        }
        assert_eq!(dns_rules, 1, "{name}");
        assert_eq!(
            reached,
            BTreeSet::from([
                ("mango-api".to_string(), "TCP".to_string(), api_port),
                (PROXY.to_string(), "TCP".to_string(), proxy_port),
            ]),
            "{name}"
        );

        // The WorkerPool names the proxy's Service, whose port leads to
        // the Pods' proxy port.
        let service = named!(release, Service, PROXY);
        let sspec = service.spec.as_ref().unwrap();
        let sport = &sspec.ports.as_ref().unwrap()[..];
        assert_eq!(sport.len(), 1);
        assert_eq!(
            sport[0].target_port,
            Some(IntOrString::String("proxy".into()))
        );
        let selector = LabelSelector {
            match_labels: sspec.selector.clone(),
            match_expressions: None,
        };
        assert_eq!(
            same_namespace_pods(
                &[NetworkPolicyPeer {
                    pod_selector: Some(selector),
                    ..Default::default()
                }],
                &pods
            ),
            BTreeSet::from([PROXY])
        );
        let egress = &pool_yaml(release)["spec"]["egress"];
        assert_eq!(
            egress["proxy"],
            format!("{PROXY}.{NAMESPACE}.svc:{}", sport[0].port),
            "{name}"
        );
        assert_eq!(
            sport[0].port, proxy_port,
            "{name}: one port number throughout"
        );
    }
}

/// Without an allowlist: the api and DNS only (the default-deny test), no
/// proxy object, no `spec.egress`; a pool left disabled renders no proxy
/// whatever its allowlist says.
#[test]
fn without_an_allowlist_no_proxy_renders() {
    let Some(r) = renders() else { return };
    for (name, release) in [("default", &r.default), ("production", &r.production)] {
        assert_no_proxy(name, release);
        let policy = named!(release, NetworkPolicy, "mango-sandbox");
        assert_eq!(
            policy.spec.as_ref().unwrap().egress.as_ref().unwrap().len(),
            2,
            "{name}: the api and DNS"
        );
    }
}

/// The proxy takes connections only from its own pool's sandbox Pods on
/// its port (not another pool's, not the chart's Pods), and on its
/// metrics port from the monitoring peers.
#[test]
fn the_proxy_admits_only_its_pools_sandboxes_and_scrapers() {
    let Some(r) = renders() else { return };
    for (name, release, _) in with_allow(r) {
        let policy = named!(release, NetworkPolicy, PROXY);
        let spec = policy.spec.as_ref().unwrap();
        assert_eq!(
            spec.policy_types.as_deref(),
            Some(&["Ingress".to_string(), "Egress".to_string()][..]),
            "{name}"
        );
        let pods = workload_labels(release);
        let selected: BTreeSet<&str> = pods
            .iter()
            .filter(|(_, l)| selects(spec.pod_selector.as_ref().unwrap(), l))
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(selected, BTreeSet::from([PROXY]), "{name}");

        let pool = all_of!(release, WorkerPool)[0];
        let mut other = pool.clone();
        other.metadata.name = Some("other".into());
        let label_sets = |pool: &WorkerPool| -> Vec<BTreeMap<String, String>> {
            sandbox_pods(pool)
                .into_iter()
                .map(|p| p.metadata.labels.unwrap())
                .collect()
        };
        for labels in label_sets(pool) {
            assert!(!selects(spec.pod_selector.as_ref().unwrap(), &labels));
        }

        let (proxy_port, metrics_port) = (
            container_port(release, "proxy"),
            container_port(release, "metrics"),
        );
        let ingress = spec.ingress.as_ref().expect("ingress rules");
        assert_eq!(ingress.len(), 2, "{name}");
        for rule in ingress {
            let ports = rule_ports(&rule.ports).expect("no rule on every port");
            let peers = rule.from.clone().unwrap_or_default();
            if ports == BTreeSet::from([("TCP".to_string(), proxy_port)]) {
                assert_eq!(peers.len(), 1, "{name}");
                for labels in label_sets(pool) {
                    assert!(
                        same_namespace_pods(&peers, &[("s".into(), labels.clone())]).len() == 1,
                        "{name}: its pool's sandbox {labels:?}"
                    );
                }
                for labels in label_sets(&other) {
                    assert!(
                        same_namespace_pods(&peers, &[("s".into(), labels.clone())]).is_empty(),
                        "{name}: another pool's sandbox {labels:?}"
                    );
                }
                assert!(same_namespace_pods(&peers, &pods).is_empty(), "{name}");
            } else {
                assert_eq!(
                    ports,
                    BTreeSet::from([("TCP".to_string(), metrics_port)]),
                    "{name}: the other rule is the metrics port's"
                );
                let want = if name == "full" {
                    vec![NetworkPolicyPeer {
                        namespace_selector: Some(LabelSelector {
                            match_labels: Some(BTreeMap::from([(
                                "kubernetes.io/metadata.name".into(),
                                "monitoring".into(),
                            )])),
                            match_expressions: None,
                        }),
                        ..Default::default()
                    }]
                } else {
                    vec![]
                };
                assert_eq!(peers, want, "{name}: egressProxy.networkPolicy.metricsFrom");
            }
        }
    }
}

/// The proxy reaches DNS (as the sandboxes do), the Kubernetes API (to
/// read its pool) and, on the allowlist's ports only, public addresses;
/// private ones too only with `allowPrivate`.
#[test]
fn the_proxy_reaches_dns_the_api_and_the_allowlists_ports_only() {
    let Some(r) = renders() else { return };
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let public = [
        "93.184.216.34",
        "1.1.1.1",
        "2606:2800:220:1:248:1893:25c8:1946",
    ];
    let private = [
        "10.96.0.1",
        "172.16.0.1",
        "192.168.1.1",
        "127.0.0.1",
        "169.254.169.254",
        "100.64.0.1",
        "fd00::1",
        "fe80::1",
        "::1",
        "::ffff:10.0.0.1",
    ];
    for (name, release, allow_private) in with_allow(r) {
        let policy = named!(release, NetworkPolicy, PROXY);
        let egress = policy.spec.as_ref().unwrap().egress.clone().unwrap();
        let sandbox_dns = named!(release, NetworkPolicy, "mango-sandbox")
            .spec
            .as_ref()
            .unwrap()
            .egress
            .as_ref()
            .unwrap()[1]
            .clone();
        assert_eq!(
            egress[0], sandbox_dns,
            "{name}: DNS as the sandboxes have it"
        );
        // No Pod of the cluster is reached by selector: only by address.
        for rule in &egress[1..] {
            for peer in rule.to.iter().flatten() {
                assert!(peer.pod_selector.is_none() && peer.namespace_selector.is_none());
            }
            assert!(
                rule_ports(&rule.ports).is_some(),
                "{name}: no rule on every port"
            );
        }
        let reaches = |addr: &str, port: i32| {
            egress
                .iter()
                .any(|r| rule_admits_address(r, ip(addr), port))
        };
        // The allowlist's ports: 443 (the default) and 8443.
        for addr in public {
            assert!(reaches(addr, 8443), "{name}: {addr}:8443");
            assert!(!reaches(addr, 80), "{name}: {addr}:80 is on no entry");
            assert!(!reaches(addr, 22), "{name}: {addr}:22 is on no entry");
        }
        for addr in private {
            assert_eq!(reaches(addr, 8443), allow_private, "{name}: {addr}:8443");
            assert!(!reaches(addr, 80), "{name}: {addr}:80");
        }
        if name == "egress" {
            // The default apiServer rule: any address on 443 and 6443,
            // until narrowed (docs/kubernetes.md says so).
            assert!(reaches("10.96.0.1", 443) && reaches("172.18.0.2", 6443));
        } else {
            // Narrowed to the API server's endpoint.
            assert!(reaches("172.18.0.2", 6443));
            assert!(!reaches("172.18.0.3", 6443) && !reaches("1.1.1.1", 6443));
            assert!(reaches("10.96.0.1", 443), "allowPrivate");
        }
    }
    // The ports are the allowlist's: an entry's port opens it, 443 by default.
    let ports_of = |release: &Release| -> BTreeSet<(String, i32)> {
        let egress = named!(release, NetworkPolicy, PROXY)
            .spec
            .clone()
            .unwrap()
            .egress
            .unwrap();
        rule_ports(&egress.last().unwrap().ports).unwrap()
    };
    let want = BTreeSet::from([("TCP".to_string(), 443), ("TCP".to_string(), 8443)]);
    assert_eq!(ports_of(&r.egress), want);
    assert_eq!(ports_of(&r.full), want);
}

/// `mango-worker egress-proxy` as the binary expects it: its pool, its
/// namespace from the downward API, both listen addresses, probes on the
/// metrics port, the controller's image, a token for reading the pool and
/// a Role that reads WorkerPools and nothing else.
#[test]
fn the_proxy_gets_the_binary_contract_and_reads_workerpools_only() {
    let Some(r) = renders() else { return };
    for (name, release, _) in with_allow(r) {
        let d = named!(release, Deployment, PROXY);
        let spec = pod_spec(template(d));
        assert_eq!(spec.containers.len(), 1);
        let c = &spec.containers[0];
        let pool = all_of!(release, WorkerPool)[0]
            .metadata
            .name
            .clone()
            .unwrap();
        assert_eq!(
            c.args.clone().unwrap(),
            ["egress-proxy", "--pool", pool.as_str()],
            "{name}"
        );
        assert!(
            c.command.is_none(),
            "{name}: the image's entrypoint is mango-worker"
        );
        let controller =
            &pod_spec(template(named!(release, Deployment, "mango-controller"))).containers[0];
        assert_eq!(c.image, controller.image, "{name}: the controller's image");
        assert_eq!(field_ref(c, "POD_NAMESPACE"), "metadata.namespace");
        // The proxy refuses its own addresses: the kubelet names them.
        assert_eq!(field_ref(c, "POD_IPS"), "status.podIPs");
        assert_eq!(env_value(c, "MANGO_EGRESS_PROXY_LISTEN"), "0.0.0.0:3128");
        assert_eq!(env_value(c, "MANGO_EGRESS_METRICS_LISTEN"), "0.0.0.0:9465");
        assert_eq!(container_port(release, "proxy"), 3128);
        assert_eq!(container_port(release, "metrics"), 9465);
        for (probe, path) in [
            (c.liveness_probe.as_ref(), "/healthz"),
            (c.readiness_probe.as_ref(), "/readyz"),
        ] {
            let http = probe
                .and_then(|p| p.http_get.as_ref())
                .expect("an HTTP probe");
            assert_eq!(http.path.as_deref(), Some(path));
            assert_eq!(http.port, IntOrString::String("metrics".into()));
        }
        assert_eq!(spec.service_account_name.as_deref(), Some(PROXY));
        assert_eq!(spec.automount_service_account_token, Some(true));

        let role = named!(release, Role, PROXY);
        let rules = role.rules.as_ref().unwrap();
        assert_eq!(rules.len(), 1, "{name}");
        assert_eq!(
            rules[0].api_groups.as_deref(),
            Some(&["mango.dev".to_string()][..])
        );
        assert_eq!(
            rules[0].resources.as_deref(),
            Some(&["workerpools".to_string()][..])
        );
        let mut verbs = rules[0].verbs.clone();
        verbs.sort();
        assert_eq!(verbs, ["get", "list", "watch"]);
        let binding = named!(release, RoleBinding, PROXY);
        assert_eq!(
            (
                binding.role_ref.kind.as_str(),
                binding.role_ref.name.as_str()
            ),
            ("Role", PROXY)
        );
        let subjects = binding.subjects.as_ref().unwrap();
        assert_eq!(
            (
                subjects.len(),
                subjects[0].kind.as_str(),
                subjects[0].name.as_str()
            ),
            (1, "ServiceAccount", PROXY)
        );
        assert_eq!(subjects[0].namespace.as_deref(), Some(NAMESPACE));
        named!(release, ServiceAccount, PROXY);

        // The pool's spec.egress carries the values.
        let egress = &pool_yaml(release)["spec"]["egress"];
        // false is the CRD's default, which the chart leaves out.
        assert_eq!(
            egress["allowPrivate"].as_bool().unwrap_or(false),
            name == "full",
            "{name}"
        );
        assert!(!egress["allowAny"].as_bool().unwrap_or(false), "{name}");
        assert_eq!(egress["allow"].as_array().unwrap().len(), 3, "{name}");
    }
    assert_eq!(
        named!(r.full, Deployment, PROXY)
            .spec
            .as_ref()
            .unwrap()
            .replicas,
        Some(3)
    );
    assert_eq!(
        named!(r.egress, Deployment, PROXY)
            .spec
            .as_ref()
            .unwrap()
            .replicas,
        Some(2)
    );
}

/// The api's own policy lets the sandboxes in on its sandbox port (else
/// the sandbox policy's egress would meet a closed door), and nothing of
/// the chart's other Pods there.
#[test]
fn the_api_admits_sandboxes_on_its_sandbox_port() {
    let Some(r) = renders() else { return };
    for (name, release) in [
        ("default", &r.default),
        ("full", &r.full),
        ("egress", &r.egress),
    ] {
        let policy = named!(release, NetworkPolicy, "mango-api");
        let ingress = policy.spec.as_ref().unwrap().ingress.clone().unwrap();
        let pool = all_of!(r.full, WorkerPool)[0];
        let pods = workload_labels(release);
        let sandbox_port = ("TCP".to_string(), 8081);
        let rules: Vec<_> = ingress
            .iter()
            .filter(|rule| rule_ports(&rule.ports).is_none_or(|p| p.contains(&sandbox_port)))
            .collect();
        assert_eq!(rules.len(), 1, "{name}: one rule for the sandbox port");
        let peers = rules[0].from.clone().expect("not every source");
        for sandbox in sandbox_pods(pool) {
            let labels = sandbox.metadata.labels.unwrap();
            assert_eq!(
                same_namespace_pods(&peers, &[("s".into(), labels)]).len(),
                1,
                "{name}"
            );
        }
        assert!(same_namespace_pods(&peers, &pods).is_empty(), "{name}");
        let ports: BTreeSet<_> = ingress
            .iter()
            .flat_map(|rule| rule_ports(&rule.ports).unwrap())
            .collect();
        assert_eq!(
            ports,
            BTreeSet::from([
                ("TCP".to_string(), 8080),
                ("TCP".to_string(), 8081),
                ("TCP".to_string(), 9465)
            ]),
            "{name}: its three ports, no other"
        );
    }
}
