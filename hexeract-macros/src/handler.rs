//! `#[handler(message = "…")]`: parse the arguments, validate the function, expand to a typed
//! adapter plus an `inventory` registration.
//!
//! Only the syntactic problems are reported here; whether the argument is a `Message` with the
//! declared `MESSAGE_TYPE`, whether the second parameter is `&Context` and whether the return
//! type is supported are checked by the compiler on generated code spanned at the user's
//! tokens, so those errors point at what the user wrote.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, LitStr, Pat, ReturnType, Type, TypePath};

use crate::args::{missing_key_span, respan, Args, Schema};
use crate::ctxt::Ctxt;
use crate::duration::timeout_arg;
use crate::fn_checks::{
    check_context_position, check_plain_async_fn, take_second_attribute, Attribute, FnRules,
};
use crate::message::check_wire_name;
use crate::types::{self, Unowned};

const SCHEMA: Schema = Schema {
    attribute: "#[handler]",
    keys: &[
        ("message", "\"OrderPlaced\""),
        ("name", "\"billing.reserve_stock\""),
        ("timeout", "\"30s\""),
        ("concurrency", "4"),
        ("crate", "\"::hexeract\""),
    ],
};

/// Highest accepted `concurrency`: beyond it the value is almost certainly a typo.
const MAX_CONCURRENCY: u64 = 10_000;

/// What `#[handler(…)]` says, validated.
struct HandlerArgs {
    message: LitStr,
    name: Option<LitStr>,
    timeout_millis: Option<u64>,
    concurrency: Option<u32>,
    /// `::hexeract`, or the path given in `crate = "…"`.
    krate: TokenStream,
}

/// The parts of the function the expansion needs.
struct HandlerFn<'a> {
    ident: &'a Ident,
    message_ty: &'a Type,
    context_ty: &'a Type,
    /// The parameters after the context: state (`State<T>`).
    state_tys: Vec<&'a Type>,
    output_ty: &'a Type,
}

pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut function: ItemFn = match syn::parse2(item.clone()) {
        Ok(function) => function,
        Err(_) => {
            let error = syn::Error::new(
                Span::call_site(),
                "`#[handler]` goes on an `async fn(message: M, ctx: &Context) -> Result<(), E>`; \
                 for a type, implement `hexeract::Handler<M>` and register it with a builder's `register_handler`",
            )
            .to_compile_error();
            return quote! { #item #error };
        }
    };
    let mut cx = Ctxt::default();
    take_second_attribute(&mut function, Attribute::Handler, &mut cx);
    let args = parse_args(args, &function.sig.ident, &mut cx);
    let handler_fn = validate_fn(&function, &mut cx);
    match (args, handler_fn, cx.into_compile_errors()) {
        (Some(args), Some(handler_fn), None) => {
            let registration = generate(&args, &handler_fn);
            quote! { #function #registration }
        }
        // Keep the user's function so IDEs and later diagnostics still see it.
        (_, _, errors) => quote! { #function #errors },
    }
}

fn parse_args(tokens: TokenStream, fn_ident: &Ident, cx: &mut Ctxt) -> Option<HandlerArgs> {
    let missing_span = missing_key_span(&tokens, Span::call_site());
    let args = Args::parse(tokens, &SCHEMA, cx);

    let message = args.string("message", "\"OrderPlaced\"", cx);
    if args.is_missing("message") {
        cx.error_at(
            missing_span,
            "`#[handler]` needs the message type it handles: `#[handler(message = \"OrderPlaced\")]`, \
             with the string given in that type's `#[message(type = \"…\")]`",
        );
    }
    if let Some(message) = &message {
        if let Err(problem) = check_wire_name(&message.value()) {
            cx.error_spanned_by(message, format!("`message` {problem}"));
        }
    }

    let name = args.string("name", "\"billing.reserve_stock\"", cx);
    if let Some(name) = &name {
        if let Err(problem) = check_handler_name(&name.value()) {
            cx.error_spanned_by(name, format!("`name` {problem}"));
        }
    }
    if args.is_missing("name") {
        let fn_name = fn_ident.unraw().to_string();
        if let Some(bad) = invalid_name_char(&fn_name) {
            cx.error_spanned_by(
                fn_ident,
                format!(
                    "handler `{fn_name}` needs `name = \"…\"` in `#[handler]`: its default name, the module path \
                     followed by `::{fn_name}`, contains {bad:?}, but handler names use only ASCII letters, \
                     digits, `_`, `-`, `.` and `:` (they become queue names)"
                ),
            );
        }
    }

    let timeout_millis = timeout_arg(&args, cx);

    let concurrency = args.integer("concurrency", "4", cx).and_then(|integer| {
        match (integer.negative, integer.lit.base10_parse::<u64>()) {
            (false, Ok(value @ 1..=MAX_CONCURRENCY)) => Some(value as u32),
            _ => {
                cx.error_spanned_by(
                    &integer.written,
                    format!(
                        "`concurrency` is how many messages this handler may process at once: \
                         a whole number from 1 to {MAX_CONCURRENCY}, e.g. `concurrency = 4`"
                    ),
                );
                None
            }
        }
    });

    let krate = args.crate_path(cx);

    Some(HandlerArgs {
        message: message?,
        name,
        timeout_millis,
        concurrency,
        krate,
    })
}

fn validate_fn<'a>(function: &'a ItemFn, cx: &mut Ctxt) -> Option<HandlerFn<'a>> {
    let sig = &function.sig;
    check_plain_async_fn(
        sig,
        cx,
        &FnRules {
            attribute: "`#[handler]`",
            parameters: "(…)",
            caller: "runtime",
            generic_advice: "the registry needs one concrete function per message type; write a \
                             handler for each message type, and share code through a generic \
                             helper they call",
        },
    );

    let mut typed = Vec::new();
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(receiver) => cx.error_spanned_by(
                receiver,
                "`#[handler]` goes on a free function, not a method: move it out of the `impl` block, \
                 or implement `hexeract::Handler<M>` for the type and register it with `register_handler`",
            ),
            FnArg::Typed(typed_arg) => typed.push(typed_arg),
        }
    }
    let usage = "a handler takes the message and the context, then any state: `async fn name(message: OrderPlaced, ctx: &Context, db: State<PgPool>)`";
    match typed.len() {
        0 => {
            if !sig
                .inputs
                .iter()
                .any(|input| matches!(input, FnArg::Receiver(_)))
            {
                cx.error_at(
                    sig.paren_token.span.join(),
                    format!("missing parameters: {usage}"),
                );
            }
            return None;
        }
        1 => cx.error_at(
            sig.paren_token.span.close(),
            format!("missing the `&Context` parameter: {usage}"),
        ),
        _ => {}
    }
    if check_context_position(sig, &typed, 1, cx) {
        return None;
    }
    let state_tys = state_parameters(typed.iter().skip(2).map(|arg| &**arg), cx);

    // `_` in a type is reported by the compiler on the function itself; the registration would
    // only repeat it.
    let mut placeholder = false;

    let message_ty = &*typed[0].ty;
    if let Type::Reference(reference) = types::peel(message_ty) {
        cx.error_spanned_by(
            reference,
            format!(
                "take the message by value, `{}: {}`: the runtime decodes a fresh value for each call and hands it over",
                pat_name(&typed[0].pat),
                types::display(&reference.elem)
            ),
        );
    } else {
        match types::find_unowned(message_ty) {
            Some(Unowned::ImplTrait(impl_trait)) => cx.error_spanned_by(
                impl_trait,
                format!(
                    "the message parameter needs a concrete type, e.g. `{}: OrderPlaced`, not `{}`: \
                     a handler handles one message type; for several, write a handler for each",
                    pat_name(&typed[0].pat),
                    types::display(message_ty)
                ),
            ),
            Some(Unowned::Borrow { tokens, written }) => cx.error_spanned_by(
                tokens,
                format!(
                    "the message type cannot borrow (`{written}`): the runtime decodes a fresh value \
                     for each call and hands it over; use a type without lifetimes, with owned fields \
                     (`String`, not `&str`)"
                ),
            ),
            Some(Unowned::Placeholder) => placeholder = true,
            None => {}
        }
    }

    let context_ty = typed.get(1).map(|arg| &*arg.ty);
    if let Some(context_ty) = context_ty {
        match types::peel(context_ty) {
            Type::Reference(reference) if reference.mutability.is_some() => cx.error_spanned_by(
                reference,
                "the context is shared: take `&Context`, not `&mut Context`",
            ),
            Type::Reference(_) => {}
            // Any other named type may be an alias of `&Context`: the generated code has the
            // compiler check it (`context_arg`), except `Context` by value, a common slip.
            Type::Path(path) if !is_context_by_value(path) => {}
            other => cx.error_spanned_by(
                other,
                format!(
                    "the second parameter must be `&Context` (a reference), found `{}`",
                    types::display(other)
                ),
            ),
        }
    }

    let output_ty = match &sig.output {
        ReturnType::Type(_, ty) => {
            match types::find_unowned(ty) {
                Some(Unowned::ImplTrait(impl_trait)) => cx.error_spanned_by(
                    impl_trait,
                    format!(
                        "a handler's return type must be named, not `{}`: \
                         `Result<(), E>`, `Result<HandlerOutcome, E>` or `HandlerOutcome`",
                        types::display(impl_trait)
                    ),
                ),
                Some(Unowned::Borrow { tokens, written }) => cx.error_spanned_by(
                    tokens,
                    format!(
                        "the return type cannot borrow (`{written}`): the result is used after the call \
                         has ended; use `&'static str` or an owned type such as `String`"
                    ),
                ),
                Some(Unowned::Placeholder) => placeholder = true,
                None => {}
            }
            Some(&**ty)
        }
        ReturnType::Default => {
            cx.error_at(
                sig.paren_token.span.close(),
                "a handler must say how the message went: add `-> Result<(), E>` (E: Display; `Err` retries) \
                 or `-> hexeract::HandlerOutcome`",
            );
            None
        }
    };

    if cx.has_errors() || placeholder {
        return None;
    }
    Some(HandlerFn {
        ident: &sig.ident,
        message_ty,
        context_ty: context_ty?,
        state_tys: state_tys?,
        output_ty: output_ty?,
    })
}

/// The types of the state parameters (after the context) of a handler or job; a reference is
/// reported here, every other type is checked by the compiler (`FromStates`) at its tokens.
pub(crate) fn state_parameters<'a>(
    params: impl Iterator<Item = &'a syn::PatType>,
    cx: &mut Ctxt,
) -> Option<Vec<&'a Type>> {
    let mut types = Vec::new();
    let mut placeholder = false;
    for param in params {
        match types::peel(&param.ty) {
            Type::Reference(reference) => {
                let inner = types::display(&reference.elem);
                let written = if inner.starts_with("State<") {
                    inner
                } else {
                    format!("State<{inner}>")
                };
                cx.error_spanned_by(
                    reference,
                    format!(
                        "state is taken by value: write `{}: {written}` and give the value to the \
                         worker with `.state(value)` (it is cloned for each call: share what is \
                         costly to clone, as pools are)",
                        pat_name(&param.pat),
                    ),
                )
            }
            _ => match types::find_unowned(&param.ty) {
                Some(Unowned::Placeholder) => placeholder = true,
                Some(Unowned::ImplTrait(impl_trait)) => cx.error_spanned_by(
                    impl_trait,
                    "state needs a concrete type, e.g. `db: State<PgPool>`",
                ),
                Some(Unowned::Borrow { tokens, written }) => cx.error_spanned_by(
                    tokens,
                    format!(
                        "state cannot borrow (`{written}`): it is given to the worker once and \
                         outlives every call; use an owned type, or an `Arc`"
                    ),
                ),
                None => {}
            },
        }
        types.push(&*param.ty);
    }
    (!placeholder).then_some(types)
}

/// `text` as a format string of `#[diagnostic::on_unimplemented]`, where braces are
/// placeholders.
fn on_unimplemented_text(text: &str) -> String {
    text.replace('{', "{{").replace('}', "}}")
}

fn is_context_by_value(path: &TypePath) -> bool {
    path.qself.is_none()
        && path
            .path
            .segments
            .last()
            .is_some_and(|segment| segment.ident == "Context" && segment.arguments.is_empty())
}

fn pat_name(pat: &Pat) -> String {
    match pat {
        Pat::Ident(ident) => ident.ident.to_string(),
        _ => "message".to_owned(),
    }
}

/// Handler names become queue and consumer-group names (`<prefix>.<name>`, `::` as `.`), so
/// they keep to characters every broker accepts.
pub(crate) fn check_handler_name(name: &str) -> Result<(), String> {
    check_name(name, "\"billing.reserve_stock\"", "it becomes a queue name")
}

/// The rules of handler names, shared by scheduled jobs: `example` is a valid name to suggest,
/// `why` says what the name is used for.
pub(crate) fn check_name(name: &str, example: &str, why: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!("must not be empty, e.g. `name = {example}`"));
    }
    if name.len() > 200 {
        return Err(format!("is {} bytes long; keep it under 200", name.len()));
    }
    if let Some(bad) = invalid_name_char(name) {
        return Err(format!(
            "contains {bad:?}: use letters, digits, `_`, `-`, `.` and `::` ({why})"
        ));
    }
    Ok(())
}

pub(crate) fn invalid_name_char(name: &str) -> Option<char> {
    name.chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')))
}

fn generate(args: &HandlerArgs, handler: &HandlerFn<'_>) -> TokenStream {
    let HandlerFn {
        ident,
        message_ty,
        context_ty,
        state_tys,
        output_ty,
    } = handler;
    let declared = &args.message;
    let krate = &args.krate;
    let private = quote!(#krate::__private);
    let adapter = format_ident!("__HexeractHandler_{}", ident);

    let name = match &args.name {
        Some(name) => quote!(#name),
        None => {
            // `r#match` is named `…::match`.
            let fn_name = ident.unraw().to_string();
            quote!(::core::concat!(::core::module_path!(), "::", #fn_name))
        }
    };
    let timeout = match args.timeout_millis {
        Some(millis) => {
            quote!(::core::option::Option::Some(::core::time::Duration::from_millis(#millis)))
        }
        None => quote!(::core::option::Option::None),
    };
    let concurrency = match args.concurrency {
        Some(limit) => quote!(::core::option::Option::Some(#limit)),
        None => quote!(::core::option::Option::None),
    };

    // Every local and parameter the expansion introduces resolves at `mixed_site`, so that
    // neither a `const message` or `struct ctx` in the user's scope nor the hygiene of a
    // `macro_rules!` the handler is declared in can capture it.
    let message = Ident::new("__hexeract_message", Span::mixed_site());
    let ctx = Ident::new("__hexeract_ctx", Span::mixed_site());

    // Spanned at the user's tokens, so a failed check points at what they wrote. Paths are
    // written out inside `quote_spanned!` (respanned) so that they carry the user's span too.
    let private_at_message = respan(&private, message_ty.span());
    let typed = quote_spanned! {message_ty.span()=>
        #private_at_message::typed::<#message_ty, #adapter>()
    };
    // The declared name and the argument type's `MESSAGE_TYPE` are compared in const
    // evaluation (the declared string is a wire name, not a type), and the result is a type,
    // `SameMessageType<false>` when they differ: a trait bound on it fails with a headline of
    // this handler's own. (A `panic!` in const evaluation would be headed "evaluation panicked".)
    let declared_text = declared.value();
    let argument = types::display(message_ty);
    let headline = on_unimplemented_text(&format!(
        "handler `{ident}` declares message {declared_text:?}, but its argument type \
         `{argument}` is another message"
    ));
    let label = on_unimplemented_text(&format!(
        "its `#[message(type = …)]` is not {declared_text:?}"
    ));
    let note = on_unimplemented_text(&format!(
        "make them agree: take the type that has `#[message(type = {declared_text:?})]` as the \
         argument, or set `message = …` in `#[handler]` to what `{argument}` has in its \
         `#[message(type = …)]`"
    ));
    let same_message_type = quote_spanned! {message_ty.span()=>
        declared_message_type::<
            #private_at_message::SameMessageType<{
                #private_at_message::str_eq(TYPED.message_type, #declared)
            }>,
        >()
    };
    let message_check = quote! {
        const TYPED: #private::Typed = #typed;

        #[diagnostic::on_unimplemented(message = #headline, label = #label, note = #note)]
        trait DeclaredMessageType {}

        #[diagnostic::do_not_recommend]
        impl DeclaredMessageType for #private::SameMessageType<true> {}

        const fn declared_message_type<T: DeclaredMessageType>() {}

        const MESSAGE_TYPE_MATCHES: #private::MakeHandler = {
            #same_message_type;
            TYPED.constructor
        };
    };
    let context_span = match types::peel(context_ty) {
        Type::Reference(reference) => reference.elem.span(),
        other => other.span(),
    };
    let private_at_context = respan(&private, context_span);
    let call_context = quote_spanned! {context_span=> #private_at_context::context_arg(#ctx) };
    let outcome_result =
        quote_spanned! {output_ty.span()=> #private::outcome_result::<#output_ty> };
    let (adapter_definition, call_args) =
        crate::state::adapter(&adapter, state_tys, &private, "state");
    let call = quote_spanned! {ident.span()=> #ident(#message, #call_context #(, #call_args)*) };
    let location = quote_spanned! {ident.span()=>
        file: ::core::file!(),
        line: ::core::line!(),
        column: ::core::column!(),
    };

    // Named, not `const _`: the one item that is valid in an `impl` block as well, so that
    // `#[handler]` on an associated function is one error, the call that cannot find it,
    // rather than a second about an unnamed `const` the user never wrote.
    let registration = format_ident!("__HEXERACT_HANDLER_{}", ident);
    quote! {
        #[doc(hidden)]
        #[allow(non_camel_case_types, non_upper_case_globals, unreachable_pub, deprecated)]
        const #registration: () = {
            #adapter_definition

            impl #private::Handler<#message_ty> for #adapter {
                type Error = #private::HandlerOutcome;

                fn handle(
                    &self,
                    #message: #message_ty,
                    #ctx: &#private::Context,
                ) -> impl ::core::future::Future<
                    Output = ::core::result::Result<(), #private::HandlerOutcome>,
                > + ::core::marker::Send {
                    #private::outcome_of(#call, #outcome_result)
                }
            }

            #message_check

            #private::inventory::submit! {
                #private::HandlerRegistration {
                    name: #name,
                    message_type: #declared,
                    #location
                    timeout: #timeout,
                    concurrency: #concurrency,
                    make: MESSAGE_TYPE_MATCHES,
                }
            }
        };
    }
}
