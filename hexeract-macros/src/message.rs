//! `#[derive(Message)]` with `#[message(type = "OrderPlaced")]`.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::DeriveInput;

use crate::args::{Args, Schema};
use crate::ctxt::Ctxt;

const SCHEMA: Schema = Schema {
    attribute: "#[message]",
    keys: &[
        ("type", "\"OrderPlaced\""),
        ("aggregate", "\"order\""),
        ("crate", "\"::hexeract\""),
    ],
};

/// What the type-level `#[message(…)]` says.
struct Declared {
    wire_name: syn::LitStr,
    aggregate: Option<syn::LitStr>,
}

/// The `#[message(key)]` field: how to reach it from `self`, and its type (for the bound).
struct KeyField {
    member: syn::Member,
    ty: syn::Type,
}

pub(crate) fn expand(input: TokenStream) -> TokenStream {
    let input: DeriveInput = match syn::parse2(input) {
        Ok(input) => input,
        Err(error) => return error.to_compile_error(),
    };
    let mut cx = Ctxt::default();
    // `::hexeract`, or the path given in `crate = "…"`.
    let mut krate = quote!(::hexeract);
    let declared = parse_declared(&input, &mut krate, &mut cx);
    let key = parse_key(&input, declared.as_ref(), &mut cx);
    if let Some(errors) = cx.into_compile_errors() {
        // The trait is still implemented (with a placeholder name) so that every use of the type
        // does not add a second, misleading "not a Message" error.
        let placeholder = Declared {
            wire_name: syn::LitStr::new("<invalid #[message(type)]>", Span::call_site()),
            aggregate: None,
        };
        let implementation = implement(&input, &placeholder, None, &krate);
        return quote! { #errors #implementation };
    }
    implement(
        &input,
        &declared.expect("no errors means a name was found"),
        key.as_ref(),
        &krate,
    )
}

/// Finds the `#[message(key)]` field; checks that there is exactly one when an aggregate is
/// declared, and none otherwise.
fn parse_key(input: &DeriveInput, declared: Option<&Declared>, cx: &mut Ctxt) -> Option<KeyField> {
    let aggregate = declared.and_then(|declared| declared.aggregate.as_ref());
    let mut keys = Vec::new();
    let fields: Vec<&syn::Field> = match &input.data {
        syn::Data::Struct(data) => data.fields.iter().collect(),
        syn::Data::Enum(data) => data.variants.iter().flat_map(|v| v.fields.iter()).collect(),
        syn::Data::Union(data) => data.fields.named.iter().collect(),
    };
    let in_struct = matches!(input.data, syn::Data::Struct(_));
    // A misplaced or misspelt field attribute is reported once, without a follow-on "no key".
    let mut misplaced = false;
    for (index, field) in fields.iter().enumerate() {
        for attr in field
            .attrs
            .iter()
            .filter(|attr| attr.path().is_ident("message"))
        {
            let is_key = attr
                .meta
                .require_list()
                .ok()
                .and_then(|list| list.parse_args::<syn::Ident>().ok())
                .is_some_and(|ident| ident == "key");
            if !is_key {
                cx.error_spanned_by(
                    attr,
                    "a field takes only `#[message(key)]`: it marks the aggregate id",
                );
                misplaced = true;
                continue;
            }
            if !in_struct {
                cx.error_spanned_by(
                    attr,
                    "`#[message(key)]` goes on a field of a struct: an enum's variants would each \
                     need one, and the key must always be there",
                );
                misplaced = true;
                continue;
            }
            let member = match &field.ident {
                Some(ident) => syn::Member::Named(ident.clone()),
                None => syn::Member::Unnamed(syn::Index::from(index)),
            };
            keys.push((
                attr,
                KeyField {
                    member,
                    ty: field.ty.clone(),
                },
            ));
        }
    }
    let ident = &input.ident;
    match (aggregate, keys.len()) {
        (_, 2..) => {
            for (attr, _) in &keys[1..] {
                cx.error_spanned_by(
                    attr,
                    "a message has one aggregate key: remove this `#[message(key)]` (or combine \
                     the fields into one id type)",
                );
            }
            None
        }
        (Some(_), 0) if misplaced => None,
        (Some(aggregate), 0) => {
            cx.error_spanned_by(
                aggregate,
                format!(
                    "`{ident}` declares the aggregate {:?} but no field is its id: mark the \
                     field with `#[message(key)]`",
                    aggregate.value()
                ),
            );
            None
        }
        (None, 1) => {
            if declared.is_some() {
                cx.error_spanned_by(
                    keys[0].0,
                    "`#[message(key)]` without an aggregate: name it on the type, \
                     `#[message(type = \"…\", aggregate = \"order\")]`",
                );
            }
            None
        }
        (Some(_), 1) => keys.pop().map(|(_, key)| key),
        (None, 0) => None,
    }
}

/// An aggregate names a topic (`<prefix>.<aggregate>`): Kafka's topic characters, short.
pub(crate) fn check_aggregate(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty: it names the aggregate, e.g. \"order\"".to_owned());
    }
    if name.len() > 100 {
        return Err(format!("is {} bytes long; keep it to 100", name.len()));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(format!(
            "{name:?} contains {bad:?}: use letters, digits, `_`, `-` and `.` (it is part of a topic name)"
        ));
    }
    Ok(())
}

/// The type-level `#[message(…)]`; its `crate = "…"`, when given, goes to `krate`.
fn parse_declared(input: &DeriveInput, krate: &mut TokenStream, cx: &mut Ctxt) -> Option<Declared> {
    let attrs: Vec<_> = input
        .attrs
        .iter()
        .filter(|attr| attr.path().is_ident("message"))
        .collect();
    let ident = &input.ident;
    let usage = format!(
        "name the message on the wire: `#[message(type = \"{ident}\")]` below `#[derive(Message)]`"
    );
    let Some(first) = attrs.first() else {
        cx.error_spanned_by(ident, format!("`{ident}` has no message type: {usage}"));
        return None;
    };
    for extra in &attrs[1..] {
        cx.error_spanned_by(
            extra,
            "give `#[message(…)]` once; put every key in the same attribute",
        );
    }
    let tokens = match first.meta.require_list() {
        Ok(list) => list.tokens.clone(),
        Err(_) => {
            cx.error_spanned_by(
                first,
                format!("`#[message]` needs the message type: {usage}"),
            );
            return None;
        }
    };
    if tokens.is_empty() {
        cx.error_spanned_by(first, format!("`#[message()]` is empty: {usage}"));
        return None;
    }
    let args = Args::parse(tokens, &SCHEMA, cx);
    *krate = args.crate_path(cx);
    let wire_name = args.string("type", &format!("\"{ident}\""), cx);
    if args.is_missing("type") {
        cx.error_spanned_by(first, format!("`#[message]` is missing `type`: {usage}"));
    }
    let aggregate = args.string("aggregate", "\"order\"", cx);
    if let Some(aggregate) = &aggregate {
        if let Err(problem) = check_aggregate(&aggregate.value()) {
            cx.error_spanned_by(aggregate, format!("the aggregate {problem}"));
        }
    }
    let wire_name = wire_name?;
    if let Err(problem) = check_wire_name(&wire_name.value()) {
        cx.error_spanned_by(&wire_name, format!("the message type {problem}"));
        return None;
    }
    Some(Declared {
        wire_name,
        aggregate,
    })
}

/// A message type is a routing key on brokers (`*` and `#` are topic wildcards there) and a
/// column value in stores, so it keeps to a conservative character set.
pub(crate) fn check_wire_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err(
            "must not be empty: it is the name the message travels under, e.g. \"OrderPlaced\""
                .to_owned(),
        );
    }
    if name.len() > 200 {
        return Err(format!("is {} bytes long; keep it under 200", name.len()));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '/')))
    {
        return Err(format!(
            "{name:?} contains {bad:?}: use letters, digits, `_`, `-`, `.`, `:` and `/` (it is used as a routing key)"
        ));
    }
    Ok(())
}

fn implement(
    input: &DeriveInput,
    declared: &Declared,
    key: Option<&KeyField>,
    krate: &TokenStream,
) -> TokenStream {
    let wire_name = &declared.wire_name;
    let ident = &input.ident;
    let private = quote!(#krate::__private);
    let mut generics = input.generics.clone();
    // A type without serde's derives, or that cannot cross threads, is reported once, by a
    // check with a headline of ours:
    // the impl holds under a bound the compiler takes on trust (`for<'a>` keeps a bound on a
    // concrete type from being checked where it is written), so that it adds serde's errors
    // of its own, and every use of the type as a message says "not a Hexeract message".
    let mut serde_check = TokenStream::new();
    if generics.params.is_empty() {
        generics
            .make_where_clause()
            .predicates
            .push(syn::parse_quote! {
                for<'__hexeract> #ident: #private::MessageSerde + #private::MessageThreadSafe
            });
        serde_check = quote::quote_spanned! {ident.span()=>
            const _: () = #private::message_serde::<#ident>();
            const _: () = #private::message_thread_safe::<#ident>();
        };
    } else {
        // A generic message is a message for every instantiation that can travel: say so, rather
        // than asking the user to repeat serde's bounds on the impl.
        let (_, ty_generics, _) = input.generics.split_for_impl();
        generics
            .make_where_clause()
            .predicates
            .push(syn::parse_quote! {
                #ident #ty_generics: #private::serde::Serialize
                    + #private::serde::de::DeserializeOwned
                    + ::core::marker::Send
                    + ::core::marker::Sync
                    + 'static
            });
    }
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    let aggregate = match (&declared.aggregate, key) {
        (Some(aggregate), Some(KeyField { member, ty })) => {
            // Spanned at the field's type: "`Vec<u8>` cannot be an aggregate key" points there.
            let to_key = quote::quote_spanned! {syn::spanned::Spanned::span(ty)=>
                <#ty as #private::AggregateKey>::to_key(&self.#member)
            };
            quote! {
                const AGGREGATE: ::core::option::Option<&'static str> =
                    ::core::option::Option::Some(#aggregate);
                fn aggregate_key(&self) -> ::core::option::Option<::std::string::String> {
                    ::core::option::Option::Some(#to_key)
                }
            }
        }
        _ => quote! {},
    };
    quote! {
        #[automatically_derived]
        impl #impl_generics #private::Message for #ident #ty_generics #where_clause {
            const MESSAGE_TYPE: &'static str = #wire_name;
            #aggregate
        }

        #serde_check
    }
}

#[cfg(test)]
mod tests {
    use super::check_wire_name;

    #[test]
    fn wire_names_are_routing_key_safe() {
        assert!(check_wire_name("OrderPlaced").is_ok());
        assert!(check_wire_name("orders.v2/OrderPlaced:1-x_y").is_ok());
        assert!(check_wire_name("").is_err());
        assert!(check_wire_name("Order Placed").is_err());
        assert!(check_wire_name("orders.*").is_err());
        assert!(check_wire_name("orders.#").is_err());
    }
}
