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
pub(crate) fn adapter(name: &Ident, state_tys: &[&Type]) -> (TokenStream, Vec<TokenStream>) {
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
        take.extend(quote_spanned! {ty.span()=>
            let #value = ::hexeract::__private::state::<#ty>(#states, #missing, #written);
        });
        fields.push(quote_spanned! {ty.span()=> #value? });
        // `Clone` alone: a type that is not state is reported once, by the build above.
        call_args.push(quote_spanned! {ty.span()=>
            ::core::clone::Clone::clone(&self.#index)
        });
    }
    let definition = quote! {
        struct #name(#(#state_tys),*);

        impl ::hexeract::__private::Build for #name {
            fn build(
                #states: &::hexeract::__private::States,
                #missing: &mut ::std::vec::Vec<&'static str>,
            ) -> ::core::option::Option<Self> {
                #take
                ::core::option::Option::Some(#name(#(#fields),*))
            }
        }
    };
    (definition, call_args)
}
