//! The state parameters of `#[handler]` and `#[scheduled]` functions (`State<T>` after the
//! context): taken once when the worker is built, and cloned for each call.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, Index, Type};

/// An adapter that holds a function's state: the struct `name`, its `Build` impl (each value
/// taken once from the worker's state, a missing one named as written), and the arguments of
/// one call, from its fields. Spanned at each type, so that a parameter that is not state is
/// reported where it is written.
///
/// Each field is a `Taken<T>`, `Clone + Send + Sync` whatever `T` is: a type that cannot be
/// state is reported once, where it is taken, not again by every bound the adapter has.
///
/// `private` is the path of the runtime's `__private` module, `take` the function of it that
/// takes one value (`state`, or `job_state` whose error speaks of jobs); a parameter written
/// `State<T>` is taken by `state_of::<T>`, whose error is about `T`.
pub(crate) fn adapter(
    name: &Ident,
    state_tys: &[&Type],
    private: &TokenStream,
    take_fn: &str,
) -> (TokenStream, Vec<TokenStream>) {
    let states = Ident::new("__hexeract_states", Span::mixed_site());
    let missing = Ident::new("__hexeract_missing", Span::mixed_site());
    let mut take = TokenStream::new();
    let mut fields = Vec::new();
    let mut call_args = Vec::new();
    for (position, ty) in state_tys.iter().enumerate() {
        let value = format_ident!("__hexeract_state_{}", position, span = Span::mixed_site());
        let index = Index::from(position);
        // The type as written, for the error that names a missing one.
        let written = crate::types::display(ty);
        let private_at_ty = crate::args::respan(private, ty.span());
        let taken = match state_value(ty) {
            Some(value_ty) => quote_spanned! {ty.span()=>
                #private_at_ty::state_of::<#value_ty>(#states, #missing, #written)
            },
            None => {
                let take_fn = Ident::new(take_fn, ty.span());
                quote_spanned! {ty.span()=>
                    #private_at_ty::#take_fn::<#ty>(#states, #missing, #written)
                }
            }
        };
        take.extend(quote_spanned! {ty.span()=> let #value = #taken; });
        fields.push(quote_spanned! {ty.span()=> #value? });
        call_args.push(quote_spanned! {ty.span()=> self.#index.get() });
    }
    let definition = quote! {
        struct #name(#(#private::Taken<#state_tys>),*);

        impl #private::Build for #name {
            fn build(
                #states: &#private::States,
                #missing: &mut ::std::vec::Vec<&'static str>,
            ) -> ::core::option::Option<Self> {
                #take
                ::core::option::Option::Some(#name(#(#fields),*))
            }
        }
    };
    (definition, call_args)
}

/// `T` of a parameter written `State<T>`.
fn state_value(ty: &Type) -> Option<&Type> {
    let Type::Path(path) = crate::types::peel(ty) else {
        return None;
    };
    let last = path.path.segments.last()?;
    match &last.arguments {
        syn::PathArguments::AngleBracketed(args)
            if path.qself.is_none() && last.ident == "State" && args.args.len() == 1 =>
        {
            match &args.args[0] {
                syn::GenericArgument::Type(inner) => Some(inner),
                _ => None,
            }
        }
        _ => None,
    }
}
