//! The checks `#[handler]` and `#[scheduled]` both make of the function they are on.

use syn::spanned::Spanned;
use syn::{GenericParam, Signature};

use crate::ctxt::Ctxt;

/// How one attribute words the common checks.
pub(crate) struct FnRules<'a> {
    /// `` `#[handler]` `` or `` `#[scheduled]` ``.
    pub(crate) attribute: &'a str,
    /// The parameter list of the fix for a missing `async`: `(…)`, `(ctx: &Context)`.
    pub(crate) parameters: &'a str,
    /// Who calls the function: "runtime", "scheduler".
    pub(crate) caller: &'a str,
    /// Why it cannot be generic, and what to do instead.
    pub(crate) generic_advice: &'a str,
}

/// Reports a function that is not `async`, is `unsafe` or is generic.
pub(crate) fn check_plain_async_fn(sig: &Signature, cx: &mut Ctxt, rules: &FnRules<'_>) {
    let attribute = rules.attribute;
    if sig.asyncness.is_none() {
        cx.error_spanned_by(
            sig.fn_token,
            format!(
                "{attribute} functions must be async: write `async fn {}{}`",
                sig.ident, rules.parameters
            ),
        );
    }
    if let Some(unsafety) = &sig.unsafety {
        cx.error_spanned_by(
            unsafety,
            format!(
                "{attribute} functions cannot be `unsafe`: the {} calls them from safe code",
                rules.caller
            ),
        );
    }
    let type_params: Vec<&GenericParam> = sig
        .generics
        .params
        .iter()
        .filter(|param| !matches!(param, GenericParam::Lifetime(_)))
        .collect();
    if !type_params.is_empty() || sig.generics.where_clause.is_some() {
        let span_of = type_params
            .first()
            .map(|param| param.span())
            .unwrap_or_else(|| sig.generics.where_clause.span());
        cx.error_at(
            span_of,
            format!(
                "{attribute} functions cannot be generic: {}",
                rules.generic_advice
            ),
        );
    }
}
