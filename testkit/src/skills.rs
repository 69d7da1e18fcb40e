//! Skills over HTTP (multipart uploads, downloads) and hand-built zip
//! archives, hostile ones included: [`RawZip`] writes exactly the headers a
//! test asks for (names, Unix modes, extra fields, declared sizes, members
//! that share data), which no well-behaved zip writer would.

use crate::{Reply, TestApp};
use reqwest::Method;
use serde_json::Value;

/// A `SKILL.md` with frontmatter `name` and `description`.
pub fn skill_md(name: &str, description: &str) -> String {
    format!("---\nname: {name}\ndescription: {description}\n---\n# {name}\n\nUse it well.\n")
}

/// One multipart part: field name, filename, bytes.
pub struct Part<'a> {
    pub field: &'a str,
    pub filename: Option<&'a str>,
    pub bytes: &'a [u8],
}

/// A `multipart/form-data` body: (content type, bytes).
pub fn multipart(parts: &[Part<'_>]) -> (String, Vec<u8>) {
    let boundary = "mango-test-boundary-7d1f0c";
    let mut body = Vec::new();
    for part in parts {
        body.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
        match part.filename {
            Some(f) => body.extend_from_slice(
                format!(
                    "Content-Disposition: form-data; name=\"{}\"; filename=\"{f}\"\r\nContent-Type: application/octet-stream\r\n\r\n",
                    part.field
                )
                .as_bytes(),
            ),
            None => body.extend_from_slice(
                format!("Content-Disposition: form-data; name=\"{}\"\r\n\r\n", part.field).as_bytes(),
            ),
        }
        body.extend_from_slice(part.bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// `files[]` parts, one per `(path, bytes)`.
pub fn file_parts<'a>(files: &'a [(&'a str, &'a [u8])]) -> Vec<Part<'a>> {
    files
        .iter()
        .map(|(path, bytes)| Part {
            field: "files[]",
            filename: Some(path),
            bytes,
        })
        .collect()
}

impl TestApp {
    /// POSTs a multipart body to `path` with `credential`.
    pub async fn post_multipart(&self, path: &str, credential: &str, parts: &[Part<'_>]) -> Reply {
        let (content_type, body) = multipart(parts);
        let resp = self
            .http
            .request(Method::POST, format!("{}{path}", self.base))
            .bearer_auth(credential)
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .unwrap();
        crate::http::reply(resp).await
    }

    /// `POST /v1/skills` with the Workspace key and `files` as `files[]`.
    pub async fn upload_skill(&self, files: &[(&str, &[u8])]) -> Reply {
        self.post_multipart("/v1/skills", &self.ws_key, &file_parts(files))
            .await
    }

    /// `POST /v1/skills/{id}/versions` with the Workspace key.
    pub async fn upload_version(&self, skill: &str, files: &[(&str, &[u8])]) -> Reply {
        self.post_multipart(
            &format!("/v1/skills/{skill}/versions"),
            &self.ws_key,
            &file_parts(files),
        )
        .await
    }

    /// A Skill named `name` with one version; returns (skill id, version).
    pub async fn create_skill(&self, name: &str, description: &str) -> (String, Value) {
        let md = skill_md(name, description);
        let r = self
            .upload_skill(&[
                (&format!("{name}/SKILL.md"), md.as_bytes()),
                (&format!("{name}/scripts/run.sh"), b"#!/bin/sh\necho ran\n"),
            ])
            .await;
        r.expect(200);
        let skill = r.body["id"].as_str().unwrap().to_string();
        let version = self
            .call(
                Method::GET,
                &format!("/v1/skills/{skill}/versions/latest"),
                Some(&self.ws_key),
                None,
            )
            .await;
        version.expect(200);
        (skill, version.body)
    }

    /// `GET …/content` with `credential`: (status, bytes).
    pub async fn download_skill(
        &self,
        skill: &str,
        version: &str,
        credential: &str,
    ) -> (reqwest::StatusCode, Vec<u8>) {
        let resp = self
            .http
            .get(format!(
                "{}/v1/skills/{skill}/versions/{version}/content",
                self.base
            ))
            .bearer_auth(credential)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        (status, resp.bytes().await.unwrap().to_vec())
    }

    /// An Agent pinning `skills` (`[{type, skill_id, version?}]`); returns its id.
    pub async fn create_agent_with_skills(&self, skills: Value) -> String {
        let r = self
            .call(
                Method::POST,
                "/v1/agents",
                Some(&self.ws_key),
                Some(serde_json::json!({"name": "skilled", "model": "m", "skills": skills})),
            )
            .await;
        r.expect(200);
        r.body["id"].as_str().unwrap().to_string()
    }
}

/// One member of a [`RawZip`].
#[derive(Clone)]
pub struct RawEntry {
    pub name: String,
    pub data: Vec<u8>,
    /// The Unix mode in the external attributes (made by a Unix host).
    pub mode: u32,
    /// Extra fields `(id, data)`, in both headers.
    pub extra: Vec<(u16, Vec<u8>)>,
    /// The uncompressed size the headers declare (default: the data's length).
    pub declared_size: Option<u32>,
    /// Deflate the data (otherwise stored).
    pub deflate: bool,
    /// Point the central directory at the previous entry's local header
    /// (two members sharing one copy of the data).
    pub share_previous: bool,
}

impl RawEntry {
    pub fn file(name: &str, data: &[u8]) -> RawEntry {
        RawEntry {
            name: name.into(),
            data: data.to_vec(),
            mode: 0o100644,
            extra: Vec::new(),
            declared_size: None,
            deflate: false,
            share_previous: false,
        }
    }

    pub fn mode(mut self, mode: u32) -> RawEntry {
        self.mode = mode;
        self
    }

    pub fn extra(mut self, id: u16, data: Vec<u8>) -> RawEntry {
        self.extra.push((id, data));
        self
    }

    pub fn declared(mut self, size: u32) -> RawEntry {
        self.declared_size = Some(size);
        self
    }

    pub fn deflated(mut self) -> RawEntry {
        self.deflate = true;
        self
    }

    pub fn sharing_previous(mut self) -> RawEntry {
        self.share_previous = true;
        self
    }
}

/// A zip archive written field by field.
#[derive(Default, Clone)]
pub struct RawZip {
    pub entries: Vec<RawEntry>,
}

impl RawZip {
    pub fn new() -> RawZip {
        RawZip::default()
    }

    pub fn with(mut self, entry: RawEntry) -> RawZip {
        self.entries.push(entry);
        self
    }

    pub fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut central = Vec::new();
        let mut previous: Option<(u32, u32, u32, u32, u16)> = None;
        for e in &self.entries {
            let crc = crc32(&e.data);
            let (method, payload) = if e.deflate {
                (8u16, deflate(&e.data))
            } else {
                (0u16, e.data.clone())
            };
            let size = e.declared_size.unwrap_or(e.data.len() as u32);
            let mut extra = Vec::new();
            for (id, data) in &e.extra {
                extra.extend_from_slice(&id.to_le_bytes());
                extra.extend_from_slice(&(data.len() as u16).to_le_bytes());
                extra.extend_from_slice(data);
            }
            let (offset, crc, csize, usize_, method) = match (e.share_previous, previous) {
                (true, Some(p)) => p,
                _ => {
                    let offset = out.len() as u32;
                    out.extend_from_slice(&0x04034b50u32.to_le_bytes());
                    out.extend_from_slice(&20u16.to_le_bytes()); // version needed
                    out.extend_from_slice(&0x0800u16.to_le_bytes()); // UTF-8 names
                    out.extend_from_slice(&method.to_le_bytes());
                    out.extend_from_slice(&0u16.to_le_bytes()); // time
                    out.extend_from_slice(&0x21u16.to_le_bytes()); // date 1980-01-01
                    out.extend_from_slice(&crc.to_le_bytes());
                    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
                    out.extend_from_slice(&size.to_le_bytes());
                    out.extend_from_slice(&(e.name.len() as u16).to_le_bytes());
                    out.extend_from_slice(&(extra.len() as u16).to_le_bytes());
                    out.extend_from_slice(e.name.as_bytes());
                    out.extend_from_slice(&extra);
                    out.extend_from_slice(&payload);
                    (offset, crc, payload.len() as u32, size, method)
                }
            };
            previous = Some((offset, crc, csize, usize_, method));
            central.extend_from_slice(&0x02014b50u32.to_le_bytes());
            central.extend_from_slice(&((3u16 << 8) | 20).to_le_bytes()); // made by Unix
            central.extend_from_slice(&20u16.to_le_bytes());
            central.extend_from_slice(&0x0800u16.to_le_bytes());
            central.extend_from_slice(&method.to_le_bytes());
            central.extend_from_slice(&0u16.to_le_bytes());
            central.extend_from_slice(&0x21u16.to_le_bytes());
            central.extend_from_slice(&crc.to_le_bytes());
            central.extend_from_slice(&csize.to_le_bytes());
            central.extend_from_slice(&usize_.to_le_bytes());
            central.extend_from_slice(&(e.name.len() as u16).to_le_bytes());
            central.extend_from_slice(&(extra.len() as u16).to_le_bytes());
            central.extend_from_slice(&0u16.to_le_bytes()); // comment
            central.extend_from_slice(&0u16.to_le_bytes()); // disk
            central.extend_from_slice(&0u16.to_le_bytes()); // internal attributes
            central.extend_from_slice(&(e.mode << 16).to_le_bytes());
            central.extend_from_slice(&offset.to_le_bytes());
            central.extend_from_slice(e.name.as_bytes());
            central.extend_from_slice(&extra);
        }
        let cd_offset = out.len() as u32;
        out.extend_from_slice(&central);
        out.extend_from_slice(&0x06054b50u32.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&(self.entries.len() as u16).to_le_bytes());
        out.extend_from_slice(&(self.entries.len() as u16).to_le_bytes());
        out.extend_from_slice(&(central.len() as u32).to_le_bytes());
        out.extend_from_slice(&cd_offset.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out
    }
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn deflate(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut enc = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}
