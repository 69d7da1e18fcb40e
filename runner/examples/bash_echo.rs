use mango_runner::tools::bash::BashSession;
use mango_runner::tools::ToolContext;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = std::env::temp_dir().join("bash_echo_ws");
        std::fs::create_dir_all(&dir).unwrap();
        let mut s = BashSession::new(Arc::new(ToolContext::new(&dir)));
        let mut v = Vec::new();
        for i in 0..(std::env::var("N").ok().and_then(|n| n.parse().ok()).unwrap_or(600)) {
            let t = Instant::now();
            let out = s.run(&json!({"command": std::env::var("CMD").map(|c| c.replace("{i}", &i.to_string())).unwrap_or(format!("echo bench-runner-{i}"))}), Instant::now() + Duration::from_secs(10), CancellationToken::new()).await;
            if i >= 100 { v.push(t.elapsed().as_secs_f64() * 1e3); }
            assert!(!out.is_error, "{:?}", out.content);
        }
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!("bash echo p50 {:.3} ms p90 {:.3} ms", v[v.len() / 2], v[v.len() * 9 / 10]);
    });
}
