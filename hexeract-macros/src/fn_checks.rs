//! The checks `#[handler]` and `#[scheduled]` both make of the function they are on.

use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{GenericParam, ItemFn, PatType, Signature, Type};

use crate::ctxt::Ctxt;
use crate::types;

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
                "{attribute} functions cannot be `unsafe`: the {} calls them from safe code, \
                 where no caller can uphold a safety contract; remove `unsafe` here and put the \
                 unsafe operations in an `unsafe {{ … }}` block inside the function",
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
    if let Some(first) = type_params.first() {
        cx.error_at(
            first.span(),
            format!(
                "{attribute} functions cannot be generic: {}",
                rules.generic_advice
            ),
        );
    } else if let Some(where_clause) = &sig.generics.where_clause {
        cx.error_spanned_by(
            where_clause,
            format!(
                "{attribute} functions cannot have a `where` clause: the {} calls one concrete \
                 function, whose types need no bounds of their own; remove the `where` clause",
                rules.caller
            ),
        );
    }
}

/// Which of the two function attributes is expanding.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attribute {
    Handler,
    Scheduled,
}

/// Reports a second `#[handler]` or `#[scheduled]` on the function and removes it, so that it
/// neither expands on its own nor repeats the error.
pub(crate) fn take_second_attribute(function: &mut ItemFn, this: Attribute, cx: &mut Ctxt) {
    let name = function.sig.ident.unraw();
    function.attrs.retain(|attr| {
        let other = match attr.path().segments.last() {
            Some(last) if last.ident == "handler" => Attribute::Handler,
            Some(last) if last.ident == "scheduled" => Attribute::Scheduled,
            _ => return true,
        };
        let message = match (this, other) {
            (Attribute::Handler, Attribute::Handler) => format!(
                "`{name}` has `#[handler]` twice: a function handles one message type under one \
                 name; for a second subscriber, write a second `#[handler]` function that calls \
                 this one"
            ),
            (Attribute::Scheduled, Attribute::Scheduled) => format!(
                "`{name}` has `#[scheduled]` twice: a scheduled job has one schedule; for a \
                 second one, write a second `#[scheduled]` function (with a `name` of its own) \
                 that calls this one"
            ),
            _ => format!(
                "`{name}` cannot be both a handler and a scheduled job: a handler is called with \
                 each message, `async fn name(message: M, ctx: &Context)`, a job on its schedule \
                 with the context alone, `async fn name(ctx: &Context)`; keep one attribute, and \
                 write the other as a second function that calls the shared code"
            ),
        };
        cx.error_spanned_by(attr, message);
        false
    });
}

/// Reports a context that is not where it belongs (`position`: 1 after a handler's message, 0
/// for a job) but later, after state or another argument, or missing before state: one error
/// that gives the order, in place of one per misplaced parameter.
pub(crate) fn check_context_position(
    sig: &Signature,
    typed: &[&PatType],
    position: usize,
    cx: &mut Ctxt,
) -> bool {
    if typed
        .get(position)
        .is_none_or(|param| is_context_ref(&param.ty))
    {
        return false;
    }
    let first_param = match position {
        0 => "first",
        _ => "right after the message",
    };
    let Some(found) = (position + 1..typed.len()).find(|&i| is_context_ref(&typed[i].ty)) else {
        if !is_state(&typed[position].ty) {
            return false;
        }
        let order = typed[..position]
            .iter()
            .map(|param| written(param))
            .chain(["ctx: &Context".to_owned()])
            .chain(typed[position..].iter().map(|param| written(param)))
            .collect::<Vec<_>>()
            .join(", ");
        cx.error_spanned_by(
            typed[position],
            format!(
                "missing the `&Context` parameter before the state: the context comes \
                 {first_param}, state after it; write `async fn {}({order})`",
                sig.ident
            ),
        );
        return true;
    };
    let before = &typed[position..found];
    if before.iter().all(|param| is_state(&param.ty)) {
        let order = typed[..position]
            .iter()
            .chain([&typed[found]])
            .chain(
                typed[position..]
                    .iter()
                    .filter(|&&param| !std::ptr::eq(param, typed[found])),
            )
            .map(|param| written(param))
            .collect::<Vec<_>>()
            .join(", ");
        cx.error_spanned_by(
            typed[found],
            format!(
                "the context comes {first_param}, and state after it (not before, as in axum): \
                 write `async fn {}({order})`",
                sig.ident
            ),
        );
    } else {
        let what = match position {
            0 => "a scheduled job takes the context first, then any state (`State<T>`)".to_owned(),
            _ => format!(
                "a handler takes one message, then `{}`, then any state (`State<T>`); for another \
                 message type, write a handler of its own",
                written(typed[found])
            ),
        };
        let extra = before
            .iter()
            .find(|param| !is_state(&param.ty))
            .expect("not all state");
        cx.error_spanned_by(
            extra,
            format!(
                "`{}` comes before the context, which goes {first_param}: {what}",
                written(extra)
            ),
        );
    }
    true
}

/// A parameter as written: `State(pool): State<PgPool>`.
fn written(param: &PatType) -> String {
    format!(
        "{}: {}",
        types::display(&param.pat),
        types::display(&param.ty)
    )
}

/// `&Context`, `&hexeract::Context`, `&'a Context`.
fn is_context_ref(ty: &Type) -> bool {
    match types::peel(ty) {
        Type::Reference(reference) => last_segment_is(&reference.elem, "Context"),
        _ => false,
    }
}

fn is_state(ty: &Type) -> bool {
    last_segment_is(ty, "State")
}

fn last_segment_is(ty: &Type, name: &str) -> bool {
    match types::peel(ty) {
        Type::Path(path) => {
            path.qself.is_none()
                && path
                    .path
                    .segments
                    .last()
                    .is_some_and(|segment| segment.ident == name)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::{check_context_position, take_second_attribute, Attribute};
    use crate::ctxt::Ctxt;
    use syn::{FnArg, ItemFn, PatType};

    /// The error of `check_context_position` for `function`, if any.
    fn context_error(function: ItemFn, position: usize) -> Option<String> {
        let typed: Vec<&PatType> = function
            .sig
            .inputs
            .iter()
            .filter_map(|input| match input {
                FnArg::Typed(typed) => Some(typed),
                FnArg::Receiver(_) => None,
            })
            .collect();
        let mut cx = Ctxt::default();
        let reported = check_context_position(&function.sig, &typed, position, &mut cx);
        let errors = cx.into_compile_errors().map(|errors| errors.to_string());
        assert_eq!(reported, errors.is_some());
        errors
    }

    #[test]
    fn a_context_after_state_is_moved_in_the_fix() {
        let error = context_error(
            syn::parse_quote! {
                async fn reserve(event: OrderPlaced, State(db): State<Pool>, ctx: &Context) {}
            },
            1,
        )
        .unwrap();
        assert!(
            error.contains(
                "async fn reserve(event: OrderPlaced, ctx: &Context, State(db): State<Pool>)"
            ),
            "{error}"
        );
        let error = context_error(
            syn::parse_quote! { async fn expire(db: State<Pool>, ctx: &hexeract::Context) {} },
            0,
        )
        .unwrap();
        assert!(error.contains("the context comes first"), "{error}");
    }

    #[test]
    fn a_missing_context_before_state_is_added_in_the_fix() {
        let error = context_error(
            syn::parse_quote! { async fn reserve(event: OrderPlaced, db: State<Pool>) {} },
            1,
        )
        .unwrap();
        assert!(
            error.contains("async fn reserve(event: OrderPlaced, ctx: &Context, db: State<Pool>)"),
            "{error}"
        );
    }

    #[test]
    fn a_second_message_is_named() {
        let error = context_error(
            syn::parse_quote! { async fn both(a: OrderPlaced, b: OrderShipped, ctx: &Context) {} },
            1,
        )
        .unwrap();
        assert!(error.contains("b: OrderShipped"), "{error}");
        assert!(error.contains("a handler takes one message"), "{error}");
    }

    #[test]
    fn the_usual_orders_pass() {
        for function in [
            syn::parse_quote! { async fn f(event: OrderPlaced, ctx: &Context, db: State<Pool>) {} },
            syn::parse_quote! { async fn f(event: OrderPlaced, ctx: Ctx<'_>) {} },
            syn::parse_quote! { async fn f(event: OrderPlaced, retries: u32) {} },
        ] {
            assert_eq!(context_error(function, 1), None);
        }
    }

    #[test]
    fn a_second_attribute_is_reported_and_removed() {
        let mut function: ItemFn = syn::parse_quote! {
            #[hexeract::scheduled(every = "1m")]
            #[doc = "kept"]
            async fn f(ctx: &Context) {}
        };
        let mut cx = Ctxt::default();
        take_second_attribute(&mut function, Attribute::Handler, &mut cx);
        let errors = cx.into_compile_errors().unwrap().to_string();
        assert!(
            errors.contains("both a handler and a scheduled job"),
            "{errors}"
        );
        assert_eq!(function.attrs.len(), 1);
    }
}
