//! Reading the types of a handler's signature: as the user wrote them, through the invisible
//! groups `macro_rules!` wraps around `$t:ty`, and for what a handler's types cannot contain.

use proc_macro2::{Delimiter, TokenStream, TokenTree};
use quote::ToTokens;
use syn::{GenericArgument, Lifetime, PathArguments, Type, TypeImplTrait, TypeParamBound};

/// The type inside any parentheses and invisible groups: `$t:ty` arrives from `macro_rules!` as
/// `Type::Group`, and `(&Context)` is a `Type::Paren`.
pub(crate) fn peel(mut ty: &Type) -> &Type {
    loop {
        match ty {
            Type::Group(group) => ty = &group.elem,
            Type::Paren(paren) => ty = &paren.elem,
            _ => return ty,
        }
    }
}

/// A type as a person would write it in a message: `Ctx<'_>` and `&mut Context`, not the
/// token stream's `Ctx < '_ >` and `& mut Context`.
pub(crate) fn display(ty: &impl ToTokens) -> String {
    let mut out = String::new();
    write_tokens(ty.to_token_stream(), &mut out);
    out
}

fn write_tokens(tokens: TokenStream, out: &mut String) {
    let mut tokens = tokens.into_iter().peekable();
    let mut after_word = false;
    while let Some(token) = tokens.next() {
        match token {
            TokenTree::Ident(ident) => {
                if after_word {
                    out.push(' ');
                }
                out.push_str(&ident.to_string());
                after_word = true;
            }
            TokenTree::Literal(literal) => {
                if after_word {
                    out.push(' ');
                }
                out.push_str(&literal.to_string());
                after_word = true;
            }
            TokenTree::Punct(punct) => {
                let c = punct.as_char();
                match c {
                    ',' | ';' => out.push_str(&format!("{c} ")),
                    '+' | '=' => out.push_str(&format!(" {c} ")),
                    '-' if matches!(tokens.peek(), Some(TokenTree::Punct(p)) if p.as_char() == '>') =>
                    {
                        out.push_str(" -");
                    }
                    '>' if out.ends_with(" -") => out.push_str("> "),
                    _ => out.push(c),
                }
                // A word after `>` is spaced only in `for<'a> fn(…)`; after other
                // punctuation it follows directly: `'a`, `&mut`, `<T`, `::T`.
                after_word = c == '>' && !out.ends_with("> ");
            }
            TokenTree::Group(group) => {
                let (open, close) = match group.delimiter() {
                    Delimiter::Parenthesis => ("(", ")"),
                    Delimiter::Bracket => ("[", "]"),
                    Delimiter::Brace => ("{ ", " }"),
                    Delimiter::None => ("", ""),
                };
                if after_word && group.delimiter() == Delimiter::None {
                    out.push(' ');
                }
                out.push_str(open);
                write_tokens(group.stream(), out);
                out.push_str(close);
                after_word = group.delimiter() == Delimiter::None;
            }
        }
    }
}

/// What keeps a type from naming an owned, fully known value, found by [`find_unowned`].
pub(crate) enum Unowned<'a> {
    /// `impl Trait`: a handler is one function for one concrete type.
    ImplTrait(&'a TypeImplTrait),
    /// A borrow: `&T`, `&'a T`, `Cow<'_, str>`, `dyn Trait + 'a`.
    Borrow {
        /// The reference type or the lifetime, to point errors at.
        tokens: TokenStream,
        /// The same, as the user wrote it: `&str`, `'a`.
        written: String,
    },
    /// `_`: the compiler rejects it in the function's own signature, so nothing more is said.
    Placeholder,
}

/// The first part of `ty` that is not owned and known: what a message the runtime decodes, or
/// a result that outlives the call, cannot be. `'static` borrows are fine; elision inside
/// `Fn(&str)` sugar and `fn(&str)` pointers is too.
pub(crate) fn find_unowned(ty: &Type) -> Option<Unowned<'_>> {
    match ty {
        Type::Group(group) => find_unowned(&group.elem),
        Type::Paren(paren) => find_unowned(&paren.elem),
        Type::Array(array) => find_unowned(&array.elem),
        Type::Slice(slice) => find_unowned(&slice.elem),
        Type::Ptr(pointer) => find_unowned(&pointer.elem),
        Type::Tuple(tuple) => tuple.elems.iter().find_map(find_unowned),
        Type::Reference(reference) => match &reference.lifetime {
            Some(lifetime) if lifetime.ident == "static" => find_unowned(&reference.elem),
            Some(lifetime) => borrowed(lifetime),
            None => Some(Unowned::Borrow {
                tokens: reference.to_token_stream(),
                written: display(ty),
            }),
        },
        Type::Path(path) => {
            if let Some(unowned) = path.qself.as_ref().and_then(|q| find_unowned(&q.ty)) {
                return Some(unowned);
            }
            path.path
                .segments
                .iter()
                .find_map(|segment| match &segment.arguments {
                    PathArguments::AngleBracketed(args) => {
                        args.args.iter().find_map(|arg| match arg {
                            GenericArgument::Lifetime(lifetime) => borrowed(lifetime),
                            GenericArgument::Type(ty) => find_unowned(ty),
                            GenericArgument::AssocType(assoc) => find_unowned(&assoc.ty),
                            _ => None,
                        })
                    }
                    // `Fn(&str) -> &str` elides within itself.
                    PathArguments::Parenthesized(_) | PathArguments::None => None,
                })
        }
        Type::TraitObject(object) => object.bounds.iter().find_map(|bound| match bound {
            TypeParamBound::Lifetime(lifetime) => borrowed(lifetime),
            _ => None,
        }),
        Type::ImplTrait(impl_trait) => Some(Unowned::ImplTrait(impl_trait)),
        Type::Infer(_) => Some(Unowned::Placeholder),
        _ => None,
    }
}

fn borrowed(lifetime: &Lifetime) -> Option<Unowned<'_>> {
    (lifetime.ident != "static").then(|| Unowned::Borrow {
        tokens: lifetime.to_token_stream(),
        written: lifetime.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::{display, find_unowned, peel, Unowned};
    use syn::{parse_quote, Type};

    #[test]
    fn displays_types_as_written() {
        let cases: [(Type, &str); 8] = [
            (parse_quote!(Ctx<'_>), "Ctx<'_>"),
            (parse_quote!(&mut Context), "&mut Context"),
            (parse_quote!(&'a hexeract::Context), "&'a hexeract::Context"),
            (parse_quote!((&Context)), "(&Context)"),
            (
                parse_quote!(Box<dyn std::error::Error + Send>),
                "Box<dyn std::error::Error + Send>",
            ),
            (
                parse_quote!(HashMap<String, [u8; 4]>),
                "HashMap<String, [u8; 4]>",
            ),
            (parse_quote!(Box<dyn Fn(u8) -> u8>), "Box<dyn Fn(u8) -> u8>"),
            (parse_quote!(for<'a> fn(&'a str)), "for<'a> fn(&'a str)"),
        ];
        for (ty, expected) in cases {
            assert_eq!(display(&ty), expected);
        }
    }

    #[test]
    fn peels_parentheses() {
        let ty: Type = parse_quote!((&Context));
        assert!(matches!(peel(&ty), Type::Reference(_)));
    }

    #[test]
    fn finds_what_is_not_owned() {
        let owned: [Type; 6] = [
            parse_quote!(OrderPlaced),
            parse_quote!(Result<(), &'static str>),
            parse_quote!(Changed<Vec<i64>>),
            parse_quote!(Result<(), Box<dyn std::error::Error + Send + Sync + 'static>>),
            parse_quote!(Box<dyn Fn(&str) -> &str>),
            parse_quote!(std::borrow::Cow<'static, str>),
        ];
        for ty in &owned {
            assert!(find_unowned(ty).is_none(), "{}", display(ty));
        }
        let borrowed: [Type; 4] = [
            parse_quote!(Result<(), &str>),
            parse_quote!(Result<(), &'a str>),
            parse_quote!(Borrowed<'_>),
            parse_quote!(Box<dyn std::error::Error + 'a>),
        ];
        for ty in &borrowed {
            assert!(
                matches!(find_unowned(ty), Some(Unowned::Borrow { .. })),
                "{}",
                display(ty)
            );
        }
        let ty: Type = parse_quote!(Vec<impl Message>);
        assert!(matches!(find_unowned(&ty), Some(Unowned::ImplTrait(_))));
        let ty: Type = parse_quote!(Vec<_>);
        assert!(matches!(find_unowned(&ty), Some(Unowned::Placeholder)));
    }
}
