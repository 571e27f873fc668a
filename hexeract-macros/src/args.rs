//! `key = value, …` attribute arguments, shared by `#[handler(…)]`, `#[scheduled(…)]` and `#[message(…)]`.
//!
//! Parsing never stops at the first problem: unknown keys, duplicates and values of the wrong
//! kind are all collected in the [`Ctxt`].

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::{Expr, ExprLit, ExprUnary, Ident, Lit, LitInt, LitStr, Token, UnOp};

use crate::ctxt::Ctxt;

/// One `key = value` pair as written.
pub(crate) struct Arg {
    pub(crate) key: Ident,
    pub(crate) value: Expr,
}

impl Arg {
    /// `key = value` as written, to point an error at the whole pair.
    pub(crate) fn tokens(&self) -> TokenStream {
        let mut tokens = self.key.to_token_stream();
        self.value.to_tokens(&mut tokens);
        tokens
    }
}

/// The arguments of one attribute, after unknown and duplicate keys were reported.
pub(crate) struct Args {
    args: Vec<Arg>,
    /// The arguments did not parse, or a key was misspelt: a key that looks missing may only be
    /// mistyped, and was already reported.
    incomplete: bool,
}

/// What an attribute accepts: its name (for messages) and its keys with an example value each.
pub(crate) struct Schema {
    pub(crate) attribute: &'static str,
    pub(crate) keys: &'static [(&'static str, &'static str)],
}

impl Schema {
    fn valid_keys(&self) -> String {
        self.keys
            .iter()
            .map(|(key, example)| format!("`{key} = {example}`"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl Args {
    pub(crate) fn parse(tokens: TokenStream, schema: &Schema, cx: &mut Ctxt) -> Args {
        let parser = |input: ParseStream<'_>| -> syn::Result<Vec<RawArg>> {
            let mut raw = Vec::new();
            while !input.is_empty() {
                raw.push(RawArg::parse(input, schema)?);
                if !input.is_empty() {
                    input.parse::<Token![,]>()?;
                }
            }
            Ok(raw)
        };
        let raw = match parser.parse2(tokens) {
            Ok(raw) => raw,
            Err(error) => {
                cx.push(error);
                return Args {
                    args: Vec::new(),
                    incomplete: true,
                };
            }
        };
        let mut args: Vec<Arg> = Vec::new();
        let mut incomplete = false;
        for RawArg { key, value } in raw {
            let name = key.unraw().to_string();
            if !schema.keys.iter().any(|(valid, _)| *valid == name) {
                incomplete = true;
                let suggestion = closest(&name, schema.keys.iter().map(|(key, _)| *key))
                    .map(|key| format!("did you mean `{key}`? "))
                    .unwrap_or_default();
                cx.error_spanned_by(
                    &key,
                    format!(
                        "unknown key `{name}` in `{}`: {suggestion}valid keys are {}",
                        schema.attribute,
                        schema.valid_keys()
                    ),
                );
                continue;
            }
            if args.iter().any(|arg| arg.key.unraw() == name) {
                cx.error_spanned_by(
                    &key,
                    format!(
                        "duplicate key `{name}` in `{}`: give each key once",
                        schema.attribute
                    ),
                );
                continue;
            }
            args.push(Arg { key, value });
        }
        Args { args, incomplete }
    }

    /// `true` when `key` is absent and no earlier error could explain it.
    pub(crate) fn is_missing(&self, key: &str) -> bool {
        !self.incomplete && self.get(key).is_none()
    }

    pub(crate) fn get(&self, key: &str) -> Option<&Arg> {
        self.args.iter().find(|arg| arg.key.unraw() == key)
    }

    /// Of two given keys, the one written second.
    pub(crate) fn later(&self, a: &str, b: &str) -> Option<&Arg> {
        self.args
            .iter()
            .filter(|arg| arg.key.unraw() == a || arg.key.unraw() == b)
            .nth(1)
    }

    /// The string value of `key`, reporting a value of another kind.
    pub(crate) fn string(&self, key: &str, example: &str, cx: &mut Ctxt) -> Option<LitStr> {
        let arg = self.get(key)?;
        match peel(&arg.value) {
            Expr::Lit(ExprLit {
                lit: Lit::Str(lit), ..
            }) => Some(lit.clone()),
            other => {
                cx.error_spanned_by(
                    other,
                    format!("`{key}` takes a string literal, e.g. `{key} = {example}`"),
                );
                None
            }
        }
    }

    /// The `crate = "…"` key: the path by which the user's code reaches the runtime crate (a
    /// dependency renamed in Cargo.toml, a re-export), as serde's `#[serde(crate = "…")]`;
    /// `::hexeract` without it, or when it is not a path (reported).
    pub(crate) fn crate_path(&self, cx: &mut Ctxt) -> TokenStream {
        let default = quote::quote!(::hexeract);
        let Some(lit) = self.string("crate", "\"::hexeract\"", cx) else {
            return default;
        };
        match lit.parse_with(syn::Path::parse_mod_style) {
            Ok(path) => path.into_token_stream(),
            Err(_) => {
                cx.error_spanned_by(
                    &lit,
                    format!(
                        "`crate` takes the path by which your code reaches hexeract, e.g. \
                         `crate = \"::hexeract\"` for a dependency renamed in Cargo.toml \
                         (`hexeract = {{ package = \"hexeract-runtime\", … }}`) or \
                         `crate = \"my_app::hexeract\"` for a re-export; {:?} is not a path",
                        lit.value()
                    ),
                );
                default
            }
        }
    }

    /// The integer value of `key`, reporting a value of another kind. A negative literal is
    /// returned as such, for the caller to say which range it accepts.
    pub(crate) fn integer(&self, key: &str, example: &str, cx: &mut Ctxt) -> Option<Integer> {
        let arg = self.get(key)?;
        let value = peel(&arg.value);
        let (negative, literal) = match value {
            Expr::Unary(ExprUnary {
                op: UnOp::Neg(_),
                expr,
                ..
            }) => (true, peel(expr)),
            other => (false, other),
        };
        match literal {
            Expr::Lit(ExprLit {
                lit: Lit::Int(lit), ..
            }) => Some(Integer {
                negative,
                lit: lit.clone(),
                written: value.clone(),
            }),
            _ => {
                cx.error_spanned_by(
                    value,
                    format!("`{key}` takes an integer literal, e.g. `{key} = {example}`"),
                );
                None
            }
        }
    }
}

/// An integer value as written, maybe negated.
pub(crate) struct Integer {
    pub(crate) negative: bool,
    pub(crate) lit: LitInt,
    /// The whole value, sign included, to point errors at.
    pub(crate) written: Expr,
}

/// The expression inside any parentheses and invisible groups: a `$v:literal` or `$v:expr`
/// passed through `macro_rules!` arrives as `Expr::Group`.
fn peel(mut expr: &Expr) -> &Expr {
    loop {
        match expr {
            Expr::Group(group) => expr = &group.expr,
            Expr::Paren(paren) => expr = &paren.expr,
            _ => return expr,
        }
    }
}

struct RawArg {
    key: Ident,
    value: Expr,
}

impl RawArg {
    fn parse(input: ParseStream<'_>, schema: &Schema) -> syn::Result<RawArg> {
        let expected = || {
            format!(
                "expected `key = value` in `{}`; valid keys are {}",
                schema.attribute,
                schema.valid_keys()
            )
        };
        // `type` is a keyword, and `#[message(type = "…")]` is how messages are named.
        let key =
            Ident::parse_any(input).map_err(|error| syn::Error::new(error.span(), expected()))?;
        if !input.peek(Token![=]) {
            return Err(syn::Error::new(
                if input.is_empty() {
                    key.span()
                } else {
                    input.span()
                },
                expected(),
            ));
        }
        let eq = input.parse::<Token![=]>()?;
        let value: Expr = input.parse().map_err(|error| {
            let name = key.unraw().to_string();
            let example = schema
                .keys
                .iter()
                .find(|(valid, _)| *valid == name)
                .map(|(_, example)| format!(", e.g. `{name} = {example}`"))
                .unwrap_or_default();
            let span = if input.is_empty() || input.peek(Token![,]) {
                eq.span
            } else {
                error.span()
            };
            syn::Error::new(span, format!("expected a value after `{name} =`{example}"))
        })?;
        Ok(RawArg { key, value })
    }
}

/// The valid key nearest to a misspelt one, if it is close enough to be a typo.
fn closest<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .map(|candidate| (edit_distance(name, candidate), candidate))
        .filter(|(distance, candidate)| *distance <= 2.max(candidate.len() / 3))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current.push(substitution.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

/// `tokens` with every span set to `span`: a path given in `crate = "…"` (spanned at the
/// string) or the default `::hexeract`, to be part of code that is spanned at the user's tokens.
pub(crate) fn respan(tokens: &TokenStream, span: Span) -> TokenStream {
    tokens
        .clone()
        .into_iter()
        .map(|mut token| {
            if let proc_macro2::TokenTree::Group(group) = &token {
                let mut respanned =
                    proc_macro2::Group::new(group.delimiter(), respan(&group.stream(), span));
                respanned.set_span(span);
                token = proc_macro2::TokenTree::Group(respanned);
            } else {
                token.set_span(span);
            }
            token
        })
        .collect()
}

/// Where to point when a required key is missing: the attribute's arguments, or the attribute
/// itself when it has none.
pub(crate) fn missing_key_span(tokens: &TokenStream, fallback: Span) -> Span {
    let mut iter = tokens.clone().into_iter();
    match iter.next() {
        Some(first) => first.span(),
        None => fallback,
    }
}

#[cfg(test)]
mod tests {
    use super::{closest, edit_distance};

    #[test]
    fn suggests_close_keys_only() {
        let keys = ["message", "name", "timeout", "concurrency"];
        assert_eq!(closest("mesage", keys.iter().copied()), Some("message"));
        assert_eq!(closest("timout", keys.iter().copied()), Some("timeout"));
        assert_eq!(closest("retries", keys.iter().copied()), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
