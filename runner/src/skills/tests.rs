//! The Session-wide limits at their edges, the roster layout, and archive
//! expansion against hostile members (the real runner against a real api is
//! in tests/it/skills.rs).

use super::archive::{extract, Budget};
use super::*;
use mango_testkit::skills::{RawEntry, RawZip};
use serde_json::json;

fn pin(skill: &str, version: &str, name: &str, size: i64) -> serde_json::Value {
    json!({"type": "custom", "skill_id": skill, "version": version, "name": name,
           "description": "d", "content_size_bytes": size, "content_sha256": "a".repeat(64)})
}

fn session(skills: serde_json::Value, multiagent: serde_json::Value) -> Session {
    serde_json::from_value(json!({
        "id": "sesn_1", "type": "session", "status": "idle", "environment_id": "env_1",
        "agent": {"type": "agent", "id": "agent_main", "version": 1, "name": "a",
                  "description": null, "system": null,
                  "model": {"id": "m", "effort": null, "inference_geo": null, "speed": "standard"},
                  "tools": [], "skills": skills, "mcp_servers": [],
                  "execution_identity": {"type": "service_account"}, "multiagent": multiagent},
        "resources": [], "metadata": {}, "title": null, "outcome_evaluations": [],
        "stats": {"active_seconds": null, "duration_seconds": null}, "usage": {},
        "vault_ids": [], "budget": null, "deployment_id": null,
        "created_at": "2026-12-01T00:00:00.000000Z", "updated_at": "2026-12-01T00:00:00.000000Z",
        "archived_at": null
    }))
    .expect("a Session")
}

fn permanent_message(result: Result<Vec<ScopePin>, PrepareError>) -> String {
    match result {
        Err(PrepareError::Permanent(m)) => m,
        other => panic!("expected a permanent error, got {other:?}"),
    }
}

#[test]
fn primary_and_roster_pins_get_their_own_directories() {
    let s = session(
        json!([pin("skill_a", "v1", "alpha", 10), {"type": "anthropic", "skill_id": "xlsx", "version": "latest"}]),
        json!({"type": "coordinator", "agents": [
            {"type": "agent", "id": "agent_main", "skills": [pin("skill_a", "v1", "alpha", 10)]},
            {"type": "agent", "id": "agent_helper", "version": 2, "name": "h",
             "skills": [pin("skill_a", "v1", "alpha", 10), pin("skill_b", "v2", "beta", 5)]},
            {"type": "advisor", "model": "m"}
        ]}),
    );
    let pins = scope_pins(&s, &Limits::default()).unwrap();
    let dirs: Vec<String> = pins
        .iter()
        .map(|p| p.relative_dir().display().to_string())
        .collect();
    assert_eq!(
        dirs,
        [
            "alpha",
            ".agents/agent_helper/alpha",
            ".agents/agent_helper/beta"
        ]
    );
}

#[test]
fn the_scope_pin_limit_holds_at_its_edge() {
    let limits = Limits::default();
    let many = |n: usize| {
        let skills: Vec<_> = (0..n)
            .map(|i| pin(&format!("skill_{i}"), "v", &format!("s{i}"), 1))
            .collect();
        session(json!(skills), json!(null))
    };
    assert_eq!(scope_pins(&many(500), &limits).unwrap().len(), 500);
    let m = permanent_message(scope_pins(&many(501), &limits));
    assert!(m.contains("501 Skill versions; at most 500"), "{m}");
    // The same pin twice counts once.
    let twice = session(
        json!([pin("s", "v", "n", 1), pin("s", "v", "n", 1)]),
        json!(null),
    );
    assert_eq!(scope_pins(&twice, &limits).unwrap().len(), 1);
}

#[test]
fn the_compressed_limit_holds_at_its_edge() {
    let limits = Limits::default();
    let half = (limits.compressed_bytes / 2) as i64;
    let at = session(
        json!([pin("a", "v", "a", half), pin("b", "v", "b", half)]),
        json!(null),
    );
    assert!(scope_pins(&at, &limits).is_ok());
    let over = session(
        json!([pin("a", "v", "a", half), pin("b", "v", "b", half + 1)]),
        json!(null),
    );
    let m = permanent_message(scope_pins(&over, &limits));
    assert!(m.contains("at most 524288000 are downloaded"), "{m}");
}

#[test]
fn a_snapshot_that_did_not_freeze_its_pins_is_refused() {
    let limits = Limits::default();
    let latest = session(
        json!([{"type": "custom", "skill_id": "s", "version": "latest"}]),
        json!(null),
    );
    assert!(permanent_message(scope_pins(&latest, &limits)).contains("without its frozen"));
    let unnamed = session(json!([pin("s", "v", "../x", 1)]), json!(null));
    assert!(permanent_message(scope_pins(&unnamed, &limits)).contains("not a Skill's slug"));
    let clash = session(
        json!([pin("a", "v", "same", 1), pin("b", "v", "same", 1)]),
        json!(null),
    );
    assert!(permanent_message(scope_pins(&clash, &limits)).contains("share the directory"));
    let bad_agent = session(
        json!([]),
        json!({"type": "coordinator", "agents": [{"type": "agent", "id": "../up", "skills": []}]}),
    );
    assert!(permanent_message(scope_pins(&bad_agent, &limits)).contains("cannot be a directory"));
}

fn expand(zip: RawZip, budget: &mut Budget) -> (tempfile::TempDir, Result<(), String>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("archive.zip");
    std::fs::write(&path, zip.bytes()).unwrap();
    let result = extract(
        std::fs::File::open(&path).unwrap(),
        &dir.path().join("out"),
        budget,
    );
    (dir, result)
}

#[test]
fn an_archive_expands_without_its_wrapper_and_with_its_modes() {
    use std::os::unix::fs::PermissionsExt;
    let zip = RawZip::new()
        .with(RawEntry::file("s/", b"").mode(0o040755))
        .with(RawEntry::file("s/SKILL.md", b"md").deflated())
        .with(RawEntry::file("s/bin/run", b"#!/bin/sh\n").mode(0o104777));
    let mut budget = Budget {
        expanded_bytes: 100,
        files: 10,
    };
    let (dir, result) = expand(zip, &mut budget);
    result.unwrap();
    let out = dir.path().join("out");
    assert_eq!(std::fs::read(out.join("SKILL.md")).unwrap(), b"md");
    let mode = std::fs::metadata(out.join("bin/run"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o755, "setuid and world-write never survive");
    assert_eq!(
        budget,
        Budget {
            expanded_bytes: 100 - 12,
            files: 8
        }
    );
}

#[test]
fn the_expanded_and_file_budgets_hold_at_their_edges() {
    let zip = || {
        RawZip::new()
            .with(RawEntry::file("s/a", &[1u8; 60]))
            .with(RawEntry::file("s/b", &[2u8; 40]).deflated())
    };
    let (_d, ok) = expand(
        zip(),
        &mut Budget {
            expanded_bytes: 100,
            files: 2,
        },
    );
    ok.unwrap();
    let (_d, bytes) = expand(
        zip(),
        &mut Budget {
            expanded_bytes: 99,
            files: 2,
        },
    );
    assert!(bytes
        .unwrap_err()
        .contains("expand to 100 bytes, more than the 99"));
    let (_d, files) = expand(
        zip(),
        &mut Budget {
            expanded_bytes: 100,
            files: 1,
        },
    );
    assert!(files
        .unwrap_err()
        .contains("holds 2 files, more than the 1"));
}

#[test]
fn hostile_members_are_refused_before_anything_is_written() {
    let mut link = vec![0u8; 12];
    link.extend_from_slice(b"target");
    for (zip, says) in [
        (RawZip::new().with(RawEntry::file("s/../../x", b"x")), ".."),
        (RawZip::new().with(RawEntry::file("/abs", b"x")), "absolute"),
        (
            RawZip::new().with(RawEntry::file("s/l", b"/").mode(0o120777)),
            "symbolic link",
        ),
        (
            RawZip::new().with(RawEntry::file("s/h", b"").extra(0x000d, link)),
            "hard or symbolic link",
        ),
        (
            RawZip::new().with(RawEntry::file("s/b", b"").mode(0o060600)),
            "block device",
        ),
        (
            RawZip::new().with(RawEntry::file("s/p", b"").mode(0o010600)),
            "FIFO",
        ),
        (
            RawZip::new().with(RawEntry::file("s/k", b"").mode(0o140600)),
            "socket",
        ),
        (
            RawZip::new()
                .with(RawEntry::file("s/a", b"1"))
                .with(RawEntry::file("s/a", b"2")),
            "more than once",
        ),
        (
            RawZip::new()
                .with(RawEntry::file("s/a", b"1"))
                .with(RawEntry::file("s/b", b"1").sharing_previous()),
            "share their data",
        ),
    ] {
        let (dir, result) = expand(
            zip,
            &mut Budget {
                expanded_bytes: 1000,
                files: 10,
            },
        );
        let err = result.unwrap_err();
        assert!(err.contains(says), "{says}: {err}");
        assert!(!dir.path().join("out").exists(), "{says}: nothing written");
    }
}

#[test]
fn a_member_that_lies_about_its_size_is_refused() {
    // A zip bomb whose header claims 10 bytes and whose data inflates to 1 MiB.
    let zip = RawZip::new().with(
        RawEntry::file("s/z", &vec![0u8; 1 << 20])
            .deflated()
            .declared(10),
    );
    let mut budget = Budget {
        expanded_bytes: 1000,
        files: 10,
    };
    let (dir, result) = expand(zip, &mut budget);
    let err = result.unwrap_err();
    assert!(err.contains("expand"), "{err}");
    let written = std::fs::metadata(dir.path().join("out/z"))
        .map(|m| m.len())
        .unwrap_or(0);
    assert!(
        written <= 11,
        "at most one byte past the header's size: {written}"
    );
}
