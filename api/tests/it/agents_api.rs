//! `/v1/agents`: create, retrieve (latest and by version), list, update into
//! new immutable versions, archive, versions, credential scopes and bad input.

use mango_testkit::*;

use reqwest::Method;
use serde_json::{json, Value};

const AGENT_FIELDS: [&str; 16] = [
    "archived_at",
    "created_at",
    "description",
    "execution_identity",
    "id",
    "mcp_servers",
    "metadata",
    "model",
    "multiagent",
    "name",
    "skills",
    "system",
    "tools",
    "type",
    "updated_at",
    "version",
];

#[track_caller]
fn assert_agent(a: &Value) {
    let obj = a
        .as_object()
        .unwrap_or_else(|| panic!("expected an Agent, got {a}"));
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, AGENT_FIELDS);
    assert!(a["id"].as_str().is_some_and(|id| id.starts_with("agent_")));
    assert_eq!(a["type"], "agent");
    assert!(a["version"].as_i64().is_some_and(|v| v >= 1));
    assert!(a["model"]["id"].is_string());
    assert!(a["tools"].is_array() && a["skills"].is_array() && a["mcp_servers"].is_array());
    assert!(a["metadata"].is_object());
    assert!(a["multiagent"].is_null());
}

#[track_caller]
fn assert_error(r: &Reply, status: u16, code: &str) {
    r.expect(status);
    assert_eq!(r.code(), Some(code), "{}", r.body);
}

async fn create(app: &TestApp, body: Value) -> Reply {
    app.call(Method::POST, "/v1/agents", Some(&app.ws_key), Some(body))
        .await
}

async fn get(app: &TestApp, path: &str) -> Reply {
    app.call(
        Method::GET,
        &format!("/v1/agents{path}"),
        Some(&app.ws_key),
        None,
    )
    .await
}

async fn update(app: &TestApp, id: &str, body: Value) -> Reply {
    app.call(
        Method::POST,
        &format!("/v1/agents/{id}"),
        Some(&app.ws_key),
        Some(body),
    )
    .await
}

async fn archive(app: &TestApp, id: &str) -> Reply {
    app.call(
        Method::POST,
        &format!("/v1/agents/{id}/archive"),
        Some(&app.ws_key),
        None,
    )
    .await
}

fn ids(page: &Value) -> Vec<String> {
    page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect()
}

async fn counts(app: &TestApp) -> (i64, i64) {
    let a = sqlx::query_scalar("SELECT count(*) FROM agents")
        .fetch_one(&app.db)
        .await
        .unwrap();
    let v = sqlx::query_scalar("SELECT count(*) FROM agent_versions")
        .fetch_one(&app.db)
        .await
        .unwrap();
    (a, v)
}

fn full_body() -> Value {
    json!({
        "name": "coder",
        "description": "writes code",
        "system": "You are careful.",
        "model": {"id": "claude-sonnet-4-5", "effort": "high", "speed": "fast"},
        "tools": [
            {
                "type": "agent_toolset_20260401",
                "default_config": {"enabled": true, "permission_policy": {"type": "always_ask"}},
                "configs": [
                    {"name": "read", "permission_policy": {"type": "always_allow"}},
                    {"name": "bash", "enabled": false},
                    {"name": "web_fetch", "permission_policy": {"type": "always_allow"},
                     "allowed_domains": ["docs.example.com"]},
                    {"name": "web_search", "enabled": false},
                ],
            },
            {
                "type": "custom",
                "name": "lookup_ticket",
                "description": "Finds a ticket",
                "input_schema": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
            },
            {"type": "mcp_toolset", "mcp_server_name": "docs"},
        ],
        "mcp_servers": [{"type": "url", "name": "docs", "url": "https://mcp.example.com/sse"}],
        "skills": [
            {"type": "anthropic", "skill_id": "xlsx"},
            {"type": "custom", "skill_id": "skill_01abc", "version": "3"},
        ],
        "metadata": {"team": "core"},
    })
}

// ------------------------------------------------------------------ create / get

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn create_minimal_fills_defaults_and_normalises_the_model(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let r = create(&app, json!({"name": "a", "model": "claude-opus-4-6"})).await;
    r.expect(200);
    let a = &r.body;
    assert_agent(a);
    assert_eq!(a["version"], 1);
    assert_eq!(
        a["model"],
        json!({"id": "claude-opus-4-6", "effort": null, "inference_geo": null, "speed": "standard"})
    );
    assert_eq!(a["tools"], json!([]));
    assert_eq!(a["execution_identity"], json!({"type": "service_account"}));
    assert!(a["description"].is_null() && a["system"].is_null() && a["archived_at"].is_null());
    assert_eq!(a["created_at"], a["updated_at"]);
    let got = get(&app, &format!("/{}", a["id"].as_str().unwrap())).await;
    got.expect(200);
    assert_eq!(got.body, *a);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn create_with_every_field_resolves_tool_configs(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let r = create(&app, full_body()).await;
    r.expect(200);
    let a = &r.body;
    assert_agent(a);
    assert_eq!(a["model"]["effort"], json!({"type": "high"}));
    assert_eq!(a["model"]["speed"], "fast");
    let toolset = &a["tools"][0];
    assert_eq!(
        toolset["default_config"],
        json!({"enabled": true, "permission_policy": {"type": "always_ask"}})
    );
    assert_eq!(
        toolset["configs"][0],
        json!({"name": "read", "type": "read", "enabled": true, "permission_policy": {"type": "always_allow"}})
    );
    assert_eq!(toolset["configs"][1]["enabled"], false);
    assert_eq!(
        toolset["configs"][1]["permission_policy"],
        json!({"type": "always_ask"})
    );
    assert_eq!(
        toolset["configs"][2]["allowed_domains"],
        json!(["docs.example.com"])
    );
    assert_eq!(a["tools"][1]["name"], "lookup_ticket");
    assert_eq!(a["tools"][1]["input_schema"]["required"], json!(["id"]));
    assert_eq!(
        a["tools"][2]["default_config"]["permission_policy"],
        json!({"type": "always_ask"})
    );
    assert_eq!(
        a["skills"],
        json!([
            {"type": "anthropic", "skill_id": "xlsx", "version": "latest"},
            {"type": "custom", "skill_id": "skill_01abc", "version": "3"},
        ])
    );
    assert_eq!(a["metadata"], json!({"team": "core"}));
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn bad_input_is_refused_and_leaves_nothing_behind(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let ok = |extra: Value| {
        let mut b = json!({"name": "n", "model": "claude-opus-4-6"});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let toolset = |configs: Value| json!([{"type": "agent_toolset_20260401", "configs": configs}]);
    let custom = |schema: Value| json!([{"type": "custom", "name": "t", "description": "d", "input_schema": schema}]);
    let invalid_parameter = [
        json!({}),
        json!({"name": "n"}),
        json!({"model": "claude-opus-4-6"}),
        ok(json!({"name": ""})),
        ok(json!({"name": "x".repeat(257)})),
        ok(json!({"model": ""})),
        ok(json!({"model": 5})),
        ok(json!({"model": {"effort": "high"}})),
        ok(json!({"model": {"id": "m", "effort": "extreme"}})),
        ok(json!({"model": {"id": "m", "speed": "warp"}})),
        ok(json!({"model": {"id": "m", "temperature": 1}})),
        ok(json!({"system": 7})),
        ok(json!({"description": "d".repeat(2049)})),
        ok(json!({"owner": "me"})),
        ok(json!({"multiagent": {"type": "coordinator"}})),
        ok(json!({"skills": [{"type": "plugin", "skill_id": "x"}]})),
        ok(json!({"skills": [{"type": "anthropic"}]})),
        ok(
            json!({"skills": [{"type": "anthropic", "skill_id": "x"}, {"type": "anthropic", "skill_id": "x"}]}),
        ),
        ok(json!({"skills": [{"type": "anthropic", "skill_id": "x", "pinned": true}]})),
        ok(json!({"mcp_servers": [{"type": "url", "name": "unused", "url": "https://x"}]})),
        ok(json!({"execution_identity": {"type": "root"}})),
        ok(json!({"tools": {"type": "custom"}})),
        ok(json!({"tools": [{"type": "agent_toolset_20260401", "extra": 1}]})),
    ];
    for body in invalid_parameter {
        assert_error(&create(&app, body.clone()).await, 400, "invalid_parameter");
    }
    let invalid_tools = [
        ok(json!({"tools": [{"type": "computer_20250124"}]})),
        ok(json!({"tools": toolset(json!([{"name": "teleport"}]))})),
        ok(json!({"tools": toolset(json!([{"name": "bash"}, {"name": "bash"}]))})),
        ok(json!({"tools": toolset(json!([{"name": "bash", "type": "read"}]))})),
        ok(
            json!({"tools": toolset(json!([{"name": "bash", "permission_policy": {"type": "auto"}}]))}),
        ),
        ok(
            json!({"tools": toolset(json!([{"name": "bash", "permission_policy": "always_allow"}]))}),
        ),
        ok(
            json!({"tools": toolset(json!([{"name": "web_fetch", "permission_policy": {"type": "always_ask"}}]))}),
        ),
        ok(json!({"tools": [{"type": "agent_toolset_20260401",
            "default_config": {"permission_policy": {"type": "always_ask"}}}]})),
        ok(json!({"tools": toolset(json!([{"name": "web_fetch", "allowed_domains": []}]))})),
        ok(
            json!({"tools": [{"type": "agent_toolset_20260401"}, {"type": "agent_toolset_20260401"}]}),
        ),
        ok(json!({"tools": [{"type": "custom", "name": "t", "description": "d"}]})),
        ok(json!({"tools": custom(json!({"type": "string"}))})),
        ok(json!({"tools": custom(json!("object"))})),
        ok(json!({"tools": custom(json!({"type": "object", "properties": []}))})),
        ok(json!({"tools": custom(json!({"type": "object", "required": [1]}))})),
        ok(json!({"tools": [
            {"type": "custom", "name": "t", "description": "d", "input_schema": {"type": "object"}},
            {"type": "custom", "name": "t", "description": "e", "input_schema": {"type": "object"}},
        ]})),
        ok(
            json!({"tools": [{"type": "custom", "name": "bad name", "description": "d",
            "input_schema": {"type": "object"}}]}),
        ),
        ok(json!({"tools": [{"type": "mcp_toolset", "mcp_server_name": "nowhere"}]})),
    ];
    for body in invalid_tools {
        assert_error(&create(&app, body.clone()).await, 400, "invalid_tools");
    }
    assert_error(
        &create(&app, ok(json!({"metadata": {"k": 1}}))).await,
        400,
        "invalid_metadata",
    );
    let many: serde_json::Map<String, Value> =
        (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
    assert_error(
        &create(&app, ok(json!({"metadata": many}))).await,
        400,
        "invalid_metadata",
    );
    let r = app
        .call_raw(Method::POST, "/v1/agents", Some(&app.ws_key), "{nope")
        .await;
    assert_error(&r, 400, "invalid_json");
    assert_eq!(counts(&app).await, (0, 0), "nothing was written");
    // The edges that are allowed.
    let edge = ok(json!({
        "name": "x".repeat(256),
        "tools": [{"type": "agent_toolset_20260401",
            "default_config": {"permission_policy": {"type": "always_ask"}},
            "configs": [{"name": "web_fetch", "enabled": false}, {"name": "web_search", "enabled": false}]}],
        "skills": [{"type": "anthropic", "skill_id": "x", "version": null}],
        "metadata": (0..16).map(|i| (format!("k{i}"), json!("v"))).collect::<serde_json::Map<_, _>>(),
        "multiagent": null,
        "execution_identity": {"type": "aws_role", "role_arn": "arn:aws:iam::1:role/r"},
    }));
    create(&app, edge).await.expect(200);
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn unknown_agents_and_versions_are_404(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    assert_error(&get(&app, "/agent_nope").await, 404, "agent_not_found");
    assert_error(
        &update(&app, "agent_nope", json!({"name": "x"})).await,
        404,
        "agent_not_found",
    );
    assert_error(&archive(&app, "agent_nope").await, 404, "agent_not_found");
    assert_error(
        &get(&app, "/agent_nope/versions").await,
        404,
        "agent_not_found",
    );
    let a = create(&app, json!({"name": "a", "model": "m"})).await.body;
    let id = a["id"].as_str().unwrap();
    assert_error(
        &get(&app, &format!("/{id}?version=2")).await,
        404,
        "agent_not_found",
    );
    assert_error(
        &get(&app, &format!("/{id}?version=0")).await,
        400,
        "invalid_parameter",
    );
    assert_error(
        &get(&app, &format!("/{id}?version=x")).await,
        400,
        "invalid_parameter",
    );
}

// ------------------------------------------------------------------ update / versions

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn update_writes_a_new_version_and_keeps_the_old_one(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let v1 = create(&app, full_body()).await.body;
    let id = v1["id"].as_str().unwrap().to_string();
    let r = update(
        &app,
        &id,
        json!({"version": 1, "system": "Be brief.", "metadata": {"team": null, "tier": "2"},
               "model": "claude-opus-4-6"}),
    )
    .await;
    r.expect(200);
    let v2 = r.body.clone();
    assert_agent(&v2);
    assert_eq!(v2["version"], 2);
    assert_eq!(v2["id"], v1["id"]);
    assert_eq!(v2["system"], "Be brief.");
    assert_eq!(v2["metadata"], json!({"tier": "2"}));
    assert_eq!(v2["model"]["id"], "claude-opus-4-6");
    assert_eq!(v2["tools"], v1["tools"], "omitted fields are kept");
    assert_eq!(v2["skills"], v1["skills"]);
    assert_eq!(v2["created_at"], v1["created_at"]);
    assert_ne!(v2["updated_at"], v1["updated_at"]);
    // Latest is v2; v1 is still there, unchanged.
    assert_eq!(get(&app, &format!("/{id}")).await.body, v2);
    let old = get(&app, &format!("/{id}?version=1")).await;
    old.expect(200);
    assert_eq!(old.body, v1);
    // Clearing: null and empty values.
    let v3 = update(
        &app,
        &id,
        json!({"tools": null, "mcp_servers": [], "skills": [], "description": ""}),
    )
    .await;
    v3.expect(200);
    assert_eq!(v3.body["version"], 3);
    assert_eq!(v3.body["tools"], json!([]));
    assert_eq!(v3.body["mcp_servers"], json!([]));
    assert!(v3.body["description"].is_null());
    // A no-op update keeps the version.
    let same = update(&app, &id, json!({"system": "Be brief."})).await;
    same.expect(200);
    assert_eq!(same.body, v3.body);
    let empty = app
        .call_raw(
            Method::POST,
            &format!("/v1/agents/{id}"),
            Some(&app.ws_key),
            "",
        )
        .await;
    empty.expect(200);
    assert_eq!(empty.body["version"], 3);
    // Versions, newest first, in pages.
    let page = get(&app, &format!("/{id}/versions?limit=2")).await;
    page.expect(200);
    let versions: Vec<i64> = page.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["version"].as_i64().unwrap())
        .collect();
    assert_eq!(versions, [3, 2]);
    let next = page.body["next_page"].as_str().unwrap();
    let rest = get(&app, &format!("/{id}/versions?limit=2&page={next}")).await;
    rest.expect(200);
    assert_eq!(rest.body["data"][0], v1);
    assert!(rest.body["next_page"].is_null());
    assert_eq!(counts(&app).await, (1, 3));
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn update_with_a_stale_version_is_409_and_bad_updates_are_400(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let a = create(&app, json!({"name": "a", "model": "m"})).await.body;
    let id = a["id"].as_str().unwrap().to_string();
    update(&app, &id, json!({"version": 1, "name": "b"}))
        .await
        .expect(200);
    let stale = update(&app, &id, json!({"version": 1, "name": "c"})).await;
    assert_error(&stale, 409, "agent_version_conflict");
    assert_eq!(stale.body["error"]["details"]["current_version"], 2);
    assert_eq!(stale.headers.get("x-should-retry").unwrap(), "false");
    for body in [
        json!({"version": 0}),
        json!({"version": "2"}),
        json!({"name": null}),
        json!({"name": ""}),
        json!({"model": null}),
        json!({"owner": "x"}),
        json!({"metadata": {"k": 1}}),
        json!({"tools": [{"type": "agent_toolset_20260401", "configs": [{"name": "web_search",
            "permission_policy": {"type": "always_ask"}}]}]}),
        json!({"mcp_servers": [{"type": "url", "name": "s", "url": "https://x"}]}),
    ] {
        let r = update(&app, &id, body.clone()).await;
        r.expect(400);
    }
    let latest = get(&app, &format!("/{id}")).await.body;
    assert_eq!(latest["version"], 2);
    assert_eq!(latest["name"], "b");
    assert_eq!(counts(&app).await, (1, 2));
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn concurrent_updates_with_the_same_version_admit_one(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let a = create(&app, json!({"name": "a", "model": "m"})).await.body;
    let id = a["id"].as_str().unwrap().to_string();
    let replies = futures::future::join_all(
        (0..8).map(|i| update(&app, &id, json!({"version": 1, "name": format!("n{i}")}))),
    )
    .await;
    let ok = replies.iter().filter(|r| r.status == 200).count();
    let conflicts = replies.iter().filter(|r| r.status == 409).count();
    assert_eq!((ok, conflicts), (1, 7));
    assert_eq!(counts(&app).await, (1, 2));
}

// ------------------------------------------------------------------ list / archive

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn list_is_newest_first_pages_and_hides_archived(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let mut made = Vec::new();
    for i in 0..5 {
        let r = create(&app, json!({"name": format!("a{i}"), "model": "m"})).await;
        made.push(r.body["id"].as_str().unwrap().to_string());
    }
    update(&app, &made[0], json!({"name": "renamed"}))
        .await
        .expect(200);
    made.reverse();
    let p1 = get(&app, "?limit=2").await;
    p1.expect(200);
    assert_eq!(ids(&p1.body), made[..2]);
    let mut seen = ids(&p1.body);
    let mut next = p1.body["next_page"].as_str().map(str::to_string);
    while let Some(page) = next {
        let p = get(&app, &format!("?limit=2&page={page}")).await;
        p.expect(200);
        seen.extend(ids(&p.body));
        next = p.body["next_page"].as_str().map(str::to_string);
    }
    assert_eq!(seen, made);
    let all = get(&app, "").await.body;
    let oldest = all["data"].as_array().unwrap().last().unwrap();
    assert_eq!(oldest["version"], 2, "list shows latest versions");
    assert_eq!(oldest["name"], "renamed");

    archive(&app, &made[1]).await.expect(200);
    let visible = ids(&get(&app, "").await.body);
    assert!(!visible.contains(&made[1]));
    assert_eq!(visible.len(), 4);
    let everything = ids(&get(&app, "?include_archived=true").await.body);
    assert_eq!(everything, made);

    // created_at filters.
    let created = get(&app, &format!("/{}", made[2])).await.body["created_at"]
        .as_str()
        .unwrap()
        .to_string();
    let gte = ids(
        &get(&app, &format!("?created_at[gte]={}", urlencode(&created)))
            .await
            .body,
    );
    assert_eq!(gte, [made[0].clone(), made[2].clone()]);
    let lte = ids(
        &get(&app, &format!("?created_at[lte]={}", urlencode(&created)))
            .await
            .body,
    );
    assert_eq!(lte, made[2..]);

    for q in [
        "?limit=0",
        "?limit=101",
        "?include_archived=yes",
        "?page=garbage",
        "?created_at[gte]=yesterday",
    ] {
        get(&app, q).await.expect(400);
    }
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn archive_is_idempotent_and_freezes_the_agent(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let a = create(&app, json!({"name": "a", "model": "m"})).await.body;
    let id = a["id"].as_str().unwrap().to_string();
    let first = archive(&app, &id).await;
    first.expect(200);
    assert_agent(&first.body);
    assert!(first.body["archived_at"].is_string());
    let again = archive(&app, &id).await;
    again.expect(200);
    assert_eq!(again.body, first.body);
    assert_error(
        &update(&app, &id, json!({"name": "b"})).await,
        400,
        "agent_archived",
    );
    let got = get(&app, &format!("/{id}")).await;
    got.expect(200);
    assert_eq!(got.body, first.body, "archived agents stay readable");
}

// ------------------------------------------------------------------ credentials

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn only_workspace_keys_reach_agents(db: sqlx::PgPool) {
    let app = TestApp::start(db).await;
    let a = create(&app, json!({"name": "a", "model": "m"})).await.body;
    let id = a["id"].as_str().unwrap().to_string();
    let (claim, _) = app.active_check().await;
    let paths = [
        (Method::POST, "/v1/agents".to_string()),
        (Method::GET, "/v1/agents".to_string()),
        (Method::GET, format!("/v1/agents/{id}")),
        (Method::POST, format!("/v1/agents/{id}")),
        (Method::POST, format!("/v1/agents/{id}/archive")),
        (Method::GET, format!("/v1/agents/{id}/versions")),
    ];
    for (method, path) in &paths {
        for credential in [app.env_key.as_str(), claim.token.as_str()] {
            let r = app
                .call(
                    method.clone(),
                    path,
                    Some(credential),
                    Some(json!({"name": "x", "model": "m"})),
                )
                .await;
            r.expect(403);
            assert_eq!(r.error_type(), Some("permission_error"));
        }
        let r = app.call(method.clone(), path, None, None).await;
        r.expect(401);
        let r = app.call(method.clone(), path, Some("sk-wrong"), None).await;
        r.expect(401);
    }
    assert_eq!(counts(&app).await, (1, 1));
    assert!(get(&app, &format!("/{id}")).await.body["archived_at"].is_null());
}
