//! `#[derive(Message)]` with `#[message(type = "OrderPlaced")]`.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::DeriveInput;

use crate::args::{Args, Schema};
use crate::ctxt::Ctxt;

const SCHEMA: Schema = Schema {
    attribute: "#[message]",
    keys: &[("type", "\"OrderPlaced\"")],
};

pub(crate) fn expand(input: TokenStream) -> TokenStream {
    let input: DeriveInput = match syn::parse2(input) {
        Ok(input) => input,
        Err(error) => return error.to_compile_error(),
    };
    let mut cx = Ctxt::default();
    let wire_name = parse_wire_name(&input, &mut cx);
    if let Some(errors) = cx.into_compile_errors() {
        // The trait is still implemented (with a placeholder name) so that every use of the type
        // does not add a second, misleading "not a Message" error.
        let placeholder = syn::LitStr::new("<invalid #[message(type)]>", Span::call_site());
        let implementation = implement(&input, &placeholder);
        return quote! { #errors #implementation };
    }
    implement(
        &input,
        &wire_name.expect("no errors means a name was found"),
    )
}

fn parse_wire_name(input: &DeriveInput, cx: &mut Ctxt) -> Option<syn::LitStr> {
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
    let wire_name = args.string("type", &format!("\"{ident}\""), cx);
    if args.is_missing("type") {
        cx.error_spanned_by(first, format!("`#[message]` is missing `type`: {usage}"));
    }
    let wire_name = wire_name?;
    if let Err(problem) = check_wire_name(&wire_name.value()) {
        cx.error_spanned_by(&wire_name, format!("the message type {problem}"));
        return None;
    }
    Some(wire_name)
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

fn implement(input: &DeriveInput, wire_name: &syn::LitStr) -> TokenStream {
    let ident = &input.ident;
    let private = quote!(::hexeract::__private);
    let mut generics = input.generics.clone();
    if !generics.params.is_empty() {
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
    quote! {
        #[automatically_derived]
        impl #impl_generics #private::Message for #ident #ty_generics #where_clause {
            const MESSAGE_TYPE: &'static str = #wire_name;
        }
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
