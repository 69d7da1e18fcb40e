//! A Docker pool with an egress allowlist: its sandboxes get the proxy
//! variables, and a tool (bash, through `$HTTPS_PROXY`) reaches an allowed
//! name and is refused a denied one. "The outside" is a server the test
//! runs on the gateway of a Docker network of its own; a fixed resolver
//! names it `allowed.test` and `denied.test`.

use crate::engine;
use crate::support::{config, end_activation, turn, Running};
use bollard::models::NetworkCreateRequest;
use mango_controller::core::supervisor::RunEnd;
use mango_controller::docker::DockerLauncher;
use mango_controller::egress::allow::Allowlist;
use mango_controller::egress::proxy::StaticResolver;
use mango_controller::egress::{serve_for_docker, DockerEgress};
use mango_testkit::{model_reply, ScriptedModel};
use serde_json::json;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Base64 in bash (the image has no `base64`), for the proxy user as
/// curl would send it from `http://work@proxy`.
const B64: &str = r#"b64() { local s="$1" t=ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/ o= i a b c n v; for ((i=0; i<${#s}; i+=3)); do n=$(( ${#s} - i )); printf -v a %d "'${s:i:1}"; b=0; c=0; [ $n -gt 1 ] && printf -v b %d "'${s:i+1:1}"; [ $n -gt 2 ] && printf -v c %d "'${s:i+2:1}"; v=$(( (a << 16) | (b << 8) | c )); o+=${t:$(( (v >> 18) & 63 )):1}${t:$(( (v >> 12) & 63 )):1}; if [ $n -gt 1 ]; then o+=${t:$(( (v >> 6) & 63 )):1}; else o+='='; fi; if [ $n -gt 2 ]; then o+=${t:$(( v & 63 )):1}; else o+='='; fi; done; printf %s "$o"; }"#;

/// CONNECTs to `$1` through `$HTTPS_PROXY`, prints the status line, and
/// when it is 200 sends `ping` and prints what comes back.
const VIA_PROXY: &str = r#"via() { local p=${HTTPS_PROXY#http://} user hp h port line reply; user=${p%@*}; hp=${p#*@}; h=${hp%:*}; port=${hp##*:}; exec 3<>/dev/tcp/$h/$port || return; printf 'CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n' "$1" "$1" "$(b64 "$user:")" >&3; IFS= read -r -t 10 line <&3; echo "$2-STATUS:${line%$'\r'}"; while IFS= read -r -t 10 h <&3 && [ "${h%$'\r'}" != "" ]; do :; done; case "$line" in *' 200 '*) printf ping >&3; IFS= read -r -t 10 -d '' reply <&3; echo "$2-REPLY:$reply";; esac; exec 3>&-; }"#;

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_tool_reaches_an_allowed_name_through_the_proxy_and_is_refused_a_denied_one(
    db: sqlx::PgPool,
) {
    let Some(engine) = engine::engine().await else {
        return;
    };
    // The outside: a network of the test's own, and a server on its gateway.
    let outside_net = format!("egress-proxy-outside-{:08x}", rand::random::<u32>());
    engine
        .docker
        .create_network(NetworkCreateRequest {
            name: outside_net.clone(),
            driver: Some("bridge".into()),
            ..Default::default()
        })
        .await
        .expect("the outside network");
    let outside_ip: IpAddr = engine
        .docker
        .inspect_network(
            &outside_net,
            None::<bollard::query_parameters::InspectNetworkOptions>,
        )
        .await
        .unwrap()
        .ipam
        .and_then(|i| i.config)
        .unwrap_or_default()
        .into_iter()
        .find_map(|c| c.gateway?.parse().ok())
        .expect("the outside network's gateway");
    let outside = tokio::net::TcpListener::bind((outside_ip, 0))
        .await
        .unwrap();
    let outside_port = outside.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = outside.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 256];
                let n = stream.read(&mut buf).await.unwrap_or(0);
                let mut out = b"outside-saw-".to_vec();
                out.extend_from_slice(&buf[..n]);
                let _ = stream.write_all(&out).await;
                let _ = stream.shutdown().await;
            });
        }
    });

    let command = format!(
        "{B64}; {VIA_PROXY}; env | grep -ci _PROXY=http://work_; \
         via allowed.test:{outside_port} ALLOWED; via denied.test:{outside_port} DENIED; \
         if timeout 5 bash -c 'exec 3<>/dev/tcp/{outside_ip}/{outside_port}' 2>/dev/null; \
         then echo DIRECT-OPEN; else echo DIRECT-BLOCKED; fi; echo FINISHED"
    );
    let model = ScriptedModel::start(vec![
        (
            200,
            model_reply(
                json!([{"type": "tool_use", "id": "t1", "name": "bash", "input": {"command": command}}]),
                "tool_use",
            ),
        ),
        (
            200,
            model_reply(json!([{"type": "text", "text": "done"}]), "end_turn"),
        ),
    ])
    .await;
    let api = engine
        .api(
            db,
            mango_api::Settings {
                model_base_url: Some(model.base.clone()),
                ..Default::default()
            },
        )
        .await;
    let pool = engine::pool("egress");
    // The proxy's port is fixed up front: the host fence admits sandboxes to it.
    let proxy_port = std::net::TcpListener::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut args = engine.args(&api);
    args.extra_peer_ports.push(proxy_port);
    let mut cfg = config(&api, 1);
    cfg.sandbox_base_url = engine::sandbox_base(&api);
    cfg.pool = pool.clone();
    let launcher = DockerLauncher::connect(&args, &pool)
        .await
        .expect("the Docker launcher connects");
    let resolver = StaticResolver(
        ["allowed.test", "denied.test"]
            .into_iter()
            .map(|n| (n.to_string(), vec![outside_ip]))
            .collect(),
    );
    let (launcher, metrics) = serve_for_docker(
        launcher,
        DockerEgress {
            allowlist: Allowlist::parse(&[format!("allowed.test:{outside_port}")], false).unwrap(),
            // The outside's address is private, as every bridge's is.
            allow_private: true,
            port: proxy_port,
            resolver: Arc::new(resolver),
        },
        &pool,
        &cfg.sandbox_base_url,
    )
    .await
    .expect("the egress proxy starts");
    let running = Running::start(&api, cfg, launcher).await;
    let session =
        mango_testkit::turns::session_with_tools(&api, json!([{"type": "agent_toolset_20260401"}]))
            .await;
    let events = turn(&api, &session, "go", "FINISHED", Duration::from_secs(120)).await;
    let output = events
        .iter()
        .rev()
        .find(|e| e["type"] == "user.tool_result")
        .and_then(|r| r["content"][0]["text"].as_str())
        .unwrap_or_default()
        .to_string();
    assert!(
        output.lines().next() == Some("4"),
        "the tool sees HTTPS_PROXY and HTTP_PROXY in both cases, naming its Work: {output}"
    );
    assert!(
        output.contains("ALLOWED-STATUS:HTTP/1.1 200 Connection established"),
        "{output}"
    );
    assert!(
        output.contains("ALLOWED-REPLY:outside-saw-ping"),
        "{output}"
    );
    assert!(
        output.contains("DENIED-STATUS:HTTP/1.1 403 Forbidden"),
        "{output}"
    );
    assert!(!output.contains("DENIED-REPLY"), "{output}");
    assert!(
        output.contains("DIRECT-BLOCKED") && !output.contains("DIRECT-OPEN"),
        "a tool that ignores the proxy variables gets nothing: {output}"
    );
    assert_eq!((metrics.allowed(), metrics.denied()), (1, 1));

    end_activation(&api, &session).await;
    assert_eq!(running.shutdown().await, RunEnd::Shutdown);
    engine.clean(&pool, &[&session]).await;
    let _ = engine.docker.remove_network(&outside_net).await;
}
