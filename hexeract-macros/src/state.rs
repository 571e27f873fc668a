//! The state parameters of `#[handler]` and `#[scheduled]` functions (`State<T>` after the
//! context): taken once when the worker is built, and cloned for each call.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, Index, Type};

/// The pieces of an adapter that holds a function's state.
pub(crate) struct StateExpansion {
    /// Statements taking each value from `states` (a missing one named in `missing`).
    pub(crate) take: TokenStream,
    /// The adapter's fields, from those values (`?` ends the build at a missing one).
    pub(crate) fields: Vec<TokenStream>,
    /// The arguments of one call, from the adapter's fields.
    pub(crate) call_args: Vec<TokenStream>,
}

/// Spanned at each type, so that a parameter that is not state is reported where it is written.
pub(crate) fn expand(state_tys: &[&Type], states: &Ident, missing: &Ident) -> StateExpansion {
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
    StateExpansion {
        take,
        fields,
        call_args,
    }
}
