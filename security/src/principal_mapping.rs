//! `ssl.principal.mapping.rules` (KIP-371, Kafka's `SslPrincipalMapper`):
//! the principal name a client certificate's subject maps to. Pure rules;
//! the node's TLS layer applies them to the certificate it verified.

use thiserror::Error;

/// `ssl.principal.mapping.rules` (KIP-371): how a client certificate's
/// subject becomes a principal's name. Rules are tried in order; the first
/// whose pattern matches the whole subject gives the name (`$1`... from its
/// groups, lower- or upper-cased with `/L` or `/U`); `DEFAULT` gives the
/// subject itself. A subject no rule matches is refused, as Kafka refuses it.
#[derive(Debug, Clone)]
pub struct PrincipalMapper {
    rules: Vec<Rule>,
}

#[derive(Debug, Clone)]
enum Rule {
    Default,
    Replace {
        pattern: regex::Regex,
        replacement: String,
        case: Option<char>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MappingError {
    #[error(
        "ssl.principal.mapping.rules {0:?}: expected DEFAULT or RULE:pattern/replacement/[L|U]"
    )]
    Syntax(String),
    #[error("ssl.principal.mapping.rules: pattern {pattern:?}: {reason}")]
    Pattern { pattern: String, reason: String },
}

impl PrincipalMapper {
    /// Parses Kafka's rule list (`RULE:^CN=(.*?),OU=.*$/$1/L,DEFAULT`);
    /// a `/` inside a pattern or replacement is written `\/`.
    pub fn parse(rules: &str) -> Result<PrincipalMapper, MappingError> {
        let mut out = Vec::new();
        let mut rest = rules.trim_start_matches([',', ' ', '\t']);
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix("DEFAULT") {
                out.push(Rule::Default);
                rest = after;
            } else if let Some(after) = rest.strip_prefix("RULE:") {
                let (pattern, after) =
                    until_slash(after).ok_or_else(|| MappingError::Syntax(rest.to_string()))?;
                let (replacement, after) =
                    until_slash(after).ok_or_else(|| MappingError::Syntax(rest.to_string()))?;
                let (case, after) = match after.chars().next() {
                    Some(c @ ('L' | 'U')) => (Some(c), &after[1..]),
                    _ => (None, after),
                };
                let pattern = regex::Regex::new(&format!("^(?:{pattern})$")).map_err(|e| {
                    MappingError::Pattern {
                        pattern: pattern.clone(),
                        reason: e.to_string(),
                    }
                })?;
                out.push(Rule::Replace {
                    pattern,
                    replacement,
                    case,
                });
                rest = after;
            } else {
                return Err(MappingError::Syntax(rest.to_string()));
            }
            let trimmed = rest.trim_start_matches([' ', '\t']);
            rest = match trimmed.strip_prefix(',') {
                Some(next) => next.trim_start_matches([' ', '\t']),
                None if trimmed.is_empty() => trimmed,
                None => return Err(MappingError::Syntax(trimmed.to_string())),
            };
        }
        if out.is_empty() {
            out.push(Rule::Default);
        }
        Ok(PrincipalMapper { rules: out })
    }

    /// The principal name of a certificate `subject`, or None when no rule
    /// matches it.
    pub fn name(&self, subject: &str) -> Option<String> {
        self.rules.iter().find_map(|rule| match rule {
            Rule::Default => Some(subject.to_string()),
            Rule::Replace {
                pattern,
                replacement,
                case,
            } => {
                let captures = pattern.captures(subject)?;
                let mut name = String::new();
                captures.expand(replacement, &mut name);
                Some(match case {
                    Some('L') => name.to_lowercase(),
                    Some('U') => name.to_uppercase(),
                    _ => name,
                })
            }
        })
    }
}

impl Default for PrincipalMapper {
    fn default() -> Self {
        PrincipalMapper {
            rules: vec![Rule::Default],
        }
    }
}

/// The text up to the next unescaped `/` (with `\/` unescaped), and what
/// follows that slash.
fn until_slash(s: &str) -> Option<(String, &str)> {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' if s[i + 1..].starts_with('/') => {
                out.push('/');
                chars.next();
            }
            '/' => return Some((out, &s[i + 1..])),
            c => out.push(c),
        }
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn mapping_rules_as_kafka_documents_them() {
        let m = PrincipalMapper::parse(
            "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/, RULE:^CN=(.*?),OU=(.*?),O=(.*?)$/$1@$2/L,\
             RULE:^.*[Cc]=([a-zA-Z0-9.]*).*$/$1/U, DEFAULT",
        )
        .unwrap();
        assert_eq!(
            m.name("CN=kafka-writer,OU=ServiceUsers,O=Org").as_deref(),
            Some("kafka-writer")
        );
        assert_eq!(
            m.name("CN=Duke,OU=JavaSoft,O=Sun").as_deref(),
            Some("duke@javasoft")
        );
        assert_eq!(m.name("C=us,L=x").as_deref(), Some("US"));
        assert_eq!(m.name("O=nothing else").as_deref(), Some("O=nothing else"));
        // Without DEFAULT an unmatched subject has no principal.
        let strict = PrincipalMapper::parse("RULE:^CN=([^,]*),O=skiff$/$1/").unwrap();
        assert_eq!(strict.name("CN=admin,O=skiff").as_deref(), Some("admin"));
        assert_eq!(strict.name("CN=admin,O=other"), None);
        // An escaped slash is part of the pattern.
        let slash = PrincipalMapper::parse(r"RULE:^CN=a\/b$/ab/").unwrap();
        assert_eq!(slash.name("CN=a/b").as_deref(), Some("ab"));
        assert_eq!(
            PrincipalMapper::parse("").unwrap().name("CN=x").as_deref(),
            Some("CN=x")
        );
        for bad in ["RULE:^CN=(.*$/x/", "RULE:nope", "DEFAULT,junk", "DEFAULTS"] {
            assert!(PrincipalMapper::parse(bad).is_err(), "{bad}");
        }
    }
}
