//! Label selectors as apimachinery parses them (k8s.io/apimachinery/pkg/
//! labels/selector.go): equality (`=`, `==`, `!=`), set-based (`in`,
//! `notin`), existence (`key`, `!key`) and `>`/`<`, comma-joined; every
//! key a qualified name, every value a label value. A selector that does
//! not parse is a 400 on the request, as the list and watch handlers
//! answer it. Field selectors: `metadata.name` and `metadata.namespace`,
//! the two every resource supports.

use super::names;
use serde_json::Value;
use std::collections::BTreeSet;

#[derive(Debug, Clone, PartialEq)]
enum Op {
    Equals,
    NotEquals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
    GreaterThan,
    LessThan,
}

#[derive(Debug, Clone, PartialEq)]
struct Requirement {
    key: String,
    op: Op,
    values: BTreeSet<String>,
}

/// A parsed label selector; empty selects everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Identifier(String),
    DoesNotExist, // !
    Equals,       // =
    DoubleEquals, // ==
    NotEquals,    // !=
    In,
    NotIn,
    Open,
    Close,
    Comma,
    Greater,
    Less,
    End,
}

impl Token {
    fn literal(&self) -> String {
        match self {
            Token::Identifier(s) => s.clone(),
            Token::DoesNotExist => "!".into(),
            Token::Equals => "=".into(),
            Token::DoubleEquals => "==".into(),
            Token::NotEquals => "!=".into(),
            Token::In => "in".into(),
            Token::NotIn => "notin".into(),
            Token::Open => "(".into(),
            Token::Close => ")".into(),
            Token::Comma => ",".into(),
            Token::Greater => ">".into(),
            Token::Less => "<".into(),
            Token::End => String::new(),
        }
    }
}

fn is_special(c: char) -> bool {
    matches!(c, '!' | '=' | '>' | '<' | '(' | ')' | ',')
}

/// The lexer: identifiers run until whitespace or a special symbol;
/// `in` and `notin` are keywords only as whole identifiers.
fn lex(input: &str) -> Vec<Token> {
    let chars: Vec<char> = input.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        if is_special(c) {
            let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
            let (token, len) = match two.as_str() {
                "==" => (Token::DoubleEquals, 2),
                "!=" => (Token::NotEquals, 2),
                _ => (
                    match c {
                        '!' => Token::DoesNotExist,
                        '=' => Token::Equals,
                        '>' => Token::Greater,
                        '<' => Token::Less,
                        '(' => Token::Open,
                        ')' => Token::Close,
                        _ => Token::Comma,
                    },
                    1,
                ),
            };
            tokens.push(token);
            i += len;
            continue;
        }
        let start = i;
        while i < chars.len() && !chars[i].is_whitespace() && !is_special(chars[i]) {
            i += 1;
        }
        let word: String = chars[start..i].iter().collect();
        tokens.push(match word.as_str() {
            "in" => Token::In,
            "notin" => Token::NotIn,
            _ => Token::Identifier(word),
        });
    }
    tokens.push(Token::End);
    tokens
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> &Token {
        &self.tokens[self.at]
    }

    fn next(&mut self) -> Token {
        let token = self.tokens[self.at].clone();
        if self.at + 1 < self.tokens.len() {
            self.at += 1;
        }
        token
    }

    /// The next token read as a value: `in` and `notin` are identifiers there.
    fn value_token(&self) -> Token {
        match self.peek() {
            Token::In => Token::Identifier("in".into()),
            Token::NotIn => Token::Identifier("notin".into()),
            other => other.clone(),
        }
    }

    fn requirement(&mut self) -> Result<Requirement, String> {
        let (key, negated) = match self.next() {
            Token::DoesNotExist => match self.next() {
                Token::Identifier(key) => (key, true),
                other => return Err(format!("found '{}', expected: identifier", other.literal())),
            },
            Token::Identifier(key) => (key, false),
            other => {
                return Err(format!(
                    "found '{}', expected: !, identifier, or 'end of string'",
                    other.literal()
                ))
            }
        };
        validate_key(&key)?;
        if negated {
            return Ok(Requirement {
                key,
                op: Op::DoesNotExist,
                values: BTreeSet::new(),
            });
        }
        let op = match self.peek() {
            Token::End | Token::Comma => {
                return Ok(Requirement {
                    key,
                    op: Op::Exists,
                    values: BTreeSet::new(),
                })
            }
            Token::Equals | Token::DoubleEquals => Op::Equals,
            Token::NotEquals => Op::NotEquals,
            Token::In => Op::In,
            Token::NotIn => Op::NotIn,
            Token::Greater => Op::GreaterThan,
            Token::Less => Op::LessThan,
            other => {
                return Err(format!(
                    "found '{}', expected: {}",
                    other.literal(),
                    "'=', '!=', '==', 'in', notin'"
                ))
            }
        };
        self.next();
        let values = match op {
            Op::In | Op::NotIn => self.set()?,
            _ => match self.value_token() {
                Token::Identifier(value) => {
                    self.next();
                    BTreeSet::from([value])
                }
                // `key=` selects the empty value.
                Token::End | Token::Comma => BTreeSet::from([String::new()]),
                other => return Err(format!("found '{}', expected: identifier", other.literal())),
            },
        };
        let requirement = Requirement { key, op, values };
        check_values(&requirement)?;
        Ok(requirement)
    }

    /// `( v1, v2 )`; `()` is the set of the empty value.
    fn set(&mut self) -> Result<BTreeSet<String>, String> {
        match self.next() {
            Token::Open => {}
            other => return Err(format!("found '{}' expected: '('", other.literal())),
        }
        let mut values = BTreeSet::new();
        if self.peek() == &Token::Close {
            self.next();
            values.insert(String::new());
            return Ok(values);
        }
        loop {
            let token = self.value_token();
            self.next();
            match token {
                Token::Identifier(value) => {
                    values.insert(value);
                    match self.next() {
                        Token::Comma => continue,
                        Token::Close => return Ok(values),
                        other => {
                            return Err(format!(
                                "found '{}', expected: ',' or ')'",
                                other.literal()
                            ))
                        }
                    }
                }
                Token::Comma => {
                    // An empty value between commas.
                    values.insert(String::new());
                }
                Token::Close => {
                    values.insert(String::new());
                    return Ok(values);
                }
                other => {
                    return Err(format!(
                        "found '{}', expected: ',', ')' or identifier",
                        other.literal()
                    ))
                }
            }
        }
    }
}

fn validate_key(key: &str) -> Result<(), String> {
    match names::qualified_name(key).first() {
        Some(msg) => Err(format!("key: Invalid value: \"{key}\": {msg}")),
        None => Ok(()),
    }
}

/// `NewRequirement`'s checks of the values for the operator.
fn check_values(r: &Requirement) -> Result<(), String> {
    let path = "values";
    match r.op {
        Op::In | Op::NotIn if r.values.is_empty() => {
            return Err(format!(
            "{path}: Invalid value: null: for 'in', 'notin' operators, values set can't be empty"
        ))
        }
        Op::Equals | Op::NotEquals if r.values.len() != 1 => {
            return Err(format!(
                "{path}: Invalid value: null: exact-match compatibility requires one single value"
            ))
        }
        Op::GreaterThan | Op::LessThan => {
            let value = r.values.iter().next().cloned().unwrap_or_default();
            if value.parse::<i64>().is_err() {
                return Err(format!(
                    "{path}[0]: Invalid value: \"{value}\": for 'Gt', 'Lt' operators, the value must be an integer"
                ));
            }
            return Ok(());
        }
        _ => {}
    }
    for (i, value) in r.values.iter().enumerate() {
        if let Some(msg) = names::label_value(value).first() {
            return Err(format!(
                "{path}[{i}][{}]: Invalid value: \"{value}\": {msg}",
                r.key
            ));
        }
    }
    Ok(())
}

impl Selector {
    /// `labels.Parse`: the error is the message of the 400.
    pub fn parse(input: &str) -> Result<Selector, String> {
        let mut parser = Parser {
            tokens: lex(input),
            at: 0,
        };
        let mut requirements = Vec::new();
        if parser.peek() == &Token::End {
            return Ok(Selector { requirements });
        }
        loop {
            let requirement = parser
                .requirement()
                .map_err(|e| format!("unable to parse requirement: {e}"))?;
            requirements.push(requirement);
            match parser.next() {
                Token::End => break,
                Token::Comma => {
                    if parser.peek() == &Token::End {
                        return Err("found '', expected: identifier after ','".into());
                    }
                }
                other => {
                    return Err(format!(
                        "found '{}', expected: ',' or 'end of string'",
                        other.literal()
                    ))
                }
            }
        }
        Ok(Selector { requirements })
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        self.requirements.iter().all(|r| {
            let value = labels.get(&r.key).and_then(Value::as_str);
            match r.op {
                Op::Equals | Op::In => value.is_some_and(|v| r.values.contains(v)),
                Op::NotEquals | Op::NotIn => value.is_none_or(|v| !r.values.contains(v)),
                Op::Exists => value.is_some(),
                Op::DoesNotExist => value.is_none(),
                Op::GreaterThan | Op::LessThan => {
                    let Some(have) = value.and_then(|v| v.parse::<i64>().ok()) else {
                        return false;
                    };
                    let want: i64 = r
                        .values
                        .iter()
                        .next()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or_default();
                    if r.op == Op::GreaterThan {
                        have > want
                    } else {
                        have < want
                    }
                }
            }
        })
    }
}

/// A field selector over `metadata.name` and `metadata.namespace`
/// (`=`, `==`, `!=`), the fields every resource supports.
#[derive(Debug, Clone, Default)]
pub struct FieldSelector {
    terms: Vec<(String, bool, String)>,
}

impl FieldSelector {
    pub fn parse(input: &str, kind: &str) -> Result<FieldSelector, String> {
        let mut terms = Vec::new();
        for term in input.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, true, v)
            } else {
                return Err(format!(
                    "invalid selector: '{input}'; can't understand '{term}'"
                ));
            };
            let field = field.trim();
            let known: &[&str] = if kind == "Pod" {
                &[
                    "metadata.name",
                    "metadata.namespace",
                    "spec.nodeName",
                    "status.phase",
                ]
            } else {
                &["metadata.name", "metadata.namespace"]
            };
            if !known.contains(&field) {
                let known: Vec<String> = known.iter().map(|k| format!("\"{k}\"")).collect();
                return Err(format!(
                    "\"{field}\" is not a known field selector: only {}",
                    known.join(", ")
                ));
            }
            terms.push((field.to_string(), equal, value.trim().to_string()));
        }
        Ok(FieldSelector { terms })
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.terms.iter().all(|(field, equal, value)| {
            let mut have = object;
            for part in field.split('.') {
                have = &have[part];
            }
            let have = have.as_str().unwrap_or("");
            (have == value) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labelled(labels: Value) -> Value {
        json!({"metadata": {"labels": labels}})
    }

    #[test]
    fn parses_and_matches_as_apimachinery() {
        let pod = labelled(json!({"app": "web", "tier": "front", "n": "5"}));
        let cases = [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app = web", true),
            ("app!=web", false),
            ("app!=db", true),
            ("missing!=x", true),
            ("app in (web, db)", true),
            ("app in (db)", false),
            ("app notin (db)", true),
            ("missing notin (db)", true),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("app=web,tier=front", true),
            ("app=web,tier=back", false),
            ("n>4", true),
            ("n<5", false),
            ("app>4", false),
            ("missing=", false),
            ("app in ()", false),
        ];
        for (selector, expected) in cases {
            let parsed = Selector::parse(selector).unwrap_or_else(|e| panic!("{selector}: {e}"));
            assert_eq!(parsed.matches(&pod), expected, "{selector:?}");
        }
        assert!(Selector::parse("empty=")
            .unwrap()
            .matches(&labelled(json!({"empty": ""}))));
    }

    #[test]
    fn refuses_what_apimachinery_refuses() {
        let too_long = format!("pool={}", "a".repeat(64));
        let bad_key = format!("{}=x", "k".repeat(64));
        let cases = [
            too_long.as_str(),
            bad_key.as_str(),
            "app=web,",
            ",app=web",
            "app in web",
            "app in (web",
            "app=(web)",
            "app=a b",
            "n>x",
            "!",
            "a/b/c=x",
            "app=we$b",
            "=web",
        ];
        for selector in cases {
            assert!(
                Selector::parse(selector).is_err(),
                "{selector:?} should not parse"
            );
        }
        let err = Selector::parse(&too_long).unwrap_err();
        assert!(err.contains("must be no more than 63 characters"), "{err}");
    }

    #[test]
    fn field_selectors_know_name_and_namespace_only() {
        let object = json!({"metadata": {"name": "a", "namespace": "ns"}});
        assert!(FieldSelector::parse("metadata.name=a", "Pod")
            .unwrap()
            .matches(&object));
        assert!(!FieldSelector::parse("metadata.name!=a", "Pod")
            .unwrap()
            .matches(&object));
        assert!(FieldSelector::parse("spec.nodeName=x", "Pod").is_ok());
        assert!(FieldSelector::parse("spec.nodeName=x", "Secret").is_err());
        assert!(FieldSelector::parse("spec.foo=x", "Pod").is_err());
    }
}
