//! Custom Skills, apart from their SQL (`store::skills`), transactions
//! (`service::skills`) and routes (`routes::skills`): the rules an upload
//! follows and the archive built from it ([`archive`], [`frontmatter`]),
//! the object store the archives live in ([`objects`]), and what the agent
//! loop tells the model about a Session's Skills ([`prompt`]).

pub mod archive;
pub mod frontmatter;
pub mod objects;
pub mod prompt;
