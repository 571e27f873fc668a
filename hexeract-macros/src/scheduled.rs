//! `#[scheduled(cron = "…")]` and `#[scheduled(every = "…")]`: parse and check the schedule at
//! compile time (with `hexeract-cron`, the parser the scheduler runs), validate the function,
//! expand to a boxed-future adapter plus an `inventory` registration.
//!
//! As for `#[handler]`, the parameter type and the return type are checked by the compiler on
//! generated code spanned at the user's tokens, so those errors point at what the user wrote.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, LitStr, ReturnType, Type, TypePath};

use crate::args::{missing_key_span, respan, Args, Schema};
use crate::ctxt::Ctxt;
use crate::duration::{parse_millis, timeout_arg};
use crate::fn_checks::{
    check_context_position, check_plain_async_fn, take_second_attribute, Attribute, FnRules,
};
use crate::handler::{check_name, invalid_name_char};
use crate::types::{self, Unowned};

const SCHEMA: Schema = Schema {
    attribute: "#[scheduled]",
    keys: &[
        ("cron", "\"0 */5 * * * *\""),
        ("every", "\"30s\""),
        ("name", "\"billing::sync\""),
        ("tz", "\"Europe/Berlin\""),
        ("catch_up", "\"none\""),
        ("timeout", "\"30s\""),
        ("crate", "\"::hexeract\""),
    ],
};

/// The shortest `every` accepted, in milliseconds.
const MIN_EVERY_MILLIS: u64 = 1_000;

/// When the job fires.
#[derive(Debug, PartialEq, Eq)]
enum When {
    /// A cron expression, checked.
    Cron(String),
    /// A period in milliseconds, at least [`MIN_EVERY_MILLIS`].
    Every(u64),
}

/// What `#[scheduled(…)]` says, validated.
struct ScheduleArgs {
    when: When,
    name: Option<LitStr>,
    /// A valid IANA name; `UTC` when not given (and always for `every`).
    tz: String,
    catch_up_none: bool,
    timeout_millis: Option<u64>,
    /// `::hexeract`, or the path given in `crate = "…"`.
    krate: TokenStream,
}

/// The parts of the function the expansion needs.
struct JobFn<'a> {
    ident: &'a Ident,
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
                "`#[scheduled]` goes on an `async fn name(ctx: &Context) -> Result<(), E>`",
            )
            .to_compile_error();
            return quote! { #item #error };
        }
    };
    let mut cx = Ctxt::default();
    take_second_attribute(&mut function, Attribute::Scheduled, &mut cx);
    let args = parse_args(args, &function.sig.ident, &mut cx);
    let job_fn = validate_fn(&function, &mut cx);
    match (args, job_fn, cx.into_compile_errors()) {
        (Some(args), Some(job_fn), None) => {
            let registration = generate(&args, &job_fn);
            quote! { #function #registration }
        }
        // Keep the user's function so IDEs and later diagnostics still see it.
        (_, _, errors) => quote! { #function #errors },
    }
}

fn parse_args(tokens: TokenStream, fn_ident: &Ident, cx: &mut Ctxt) -> Option<ScheduleArgs> {
    let missing_span = missing_key_span(&tokens, Span::call_site());
    let args = Args::parse(tokens, &SCHEMA, cx);

    let cron = args
        .string("cron", "\"0 */5 * * * *\"", cx)
        .and_then(|lit| match check_cron(&lit.value()) {
            Ok(()) => Some(lit.value()),
            Err(message) => {
                cx.error_spanned_by(&lit, message);
                None
            }
        });
    let every =
        args.string("every", "\"30s\"", cx)
            .and_then(|lit| match check_every(&lit.value()) {
                Ok(millis) => Some(millis),
                Err(message) => {
                    cx.error_spanned_by(&lit, message);
                    None
                }
            });
    let when = match (args.get("cron"), args.get("every")) {
        (Some(_), Some(every_arg)) => {
            let second = args.later("cron", "every").unwrap_or(every_arg);
            cx.error_spanned_by(
                second.tokens(),
                "give `cron` or `every`, not both: a scheduled job has one schedule",
            );
            None
        }
        (Some(_), None) => cron.map(When::Cron),
        (None, Some(_)) => every.map(When::Every),
        (None, None) => {
            if args.is_missing("cron") && args.is_missing("every") {
                cx.error_at(
                    missing_span,
                    "`#[scheduled]` needs a schedule: `cron = \"0 */5 * * * *\"` (second minute hour \
                     day-of-month month day-of-week) or `every = \"30s\"`",
                );
            }
            None
        }
    };

    let tz_lit = args.string("tz", "\"Europe/Berlin\"", cx);
    let mut tz = "UTC".to_owned();
    if let Some(tz_arg) = args.get("tz") {
        if args.get("every").is_some() {
            cx.error_spanned_by(
                tz_arg.tokens(),
                "`tz` applies to `cron` schedules only: `every` fire times count from the Unix \
                 epoch, in UTC; remove `tz`",
            );
        } else if let Some(lit) = &tz_lit {
            match hexeract_cron::parse_time_zone(&lit.value()) {
                Ok(_) => tz = lit.value(),
                Err(error) => cx.error_spanned_by(lit, error),
            }
        }
    }

    let catch_up_none = args
        .string("catch_up", "\"none\"", cx)
        .and_then(|lit| match parse_catch_up(&lit.value()) {
            Ok(none) => Some(none),
            Err(message) => {
                cx.error_spanned_by(&lit, message);
                None
            }
        })
        .unwrap_or(false);

    let name = args.string("name", "\"billing::sync\"", cx);
    if let Some(name) = &name {
        if let Err(problem) = check_job_name(&name.value()) {
            cx.error_spanned_by(name, format!("`name` {problem}"));
        }
    }
    if args.is_missing("name") {
        let fn_name = fn_ident.unraw().to_string();
        if let Some(bad) = invalid_name_char(&fn_name) {
            cx.error_spanned_by(
                fn_ident,
                format!(
                    "scheduled job `{fn_name}` needs `name = \"…\"` in `#[scheduled]`: its default name, \
                     the module path followed by `::{fn_name}`, contains {bad:?}, but job names use only \
                     ASCII letters, digits, `_`, `-`, `.` and `:`"
                ),
            );
        }
    }

    let timeout_millis = timeout_arg(&args, cx);
    let krate = args.crate_path(cx);

    Some(ScheduleArgs {
        when: when?,
        name,
        tz,
        catch_up_none,
        timeout_millis,
        krate,
    })
}

/// A cron expression as the scheduler will parse it; the error quotes the expression.
fn check_cron(text: &str) -> Result<(), String> {
    let error = match hexeract_cron::Cron::parse(text) {
        Ok(_) => return Ok(()),
        Err(error) => error.to_string(),
    };
    let source = text.trim();
    let never_fires = format!("the expression \"{source}\"");
    if source.is_empty() {
        // "the cron expression is empty: …"
        Err(error)
    } else if let Some(rest) = error.strip_prefix(&never_fires) {
        // "the expression "…" never fires: …" quotes it already.
        Err(format!("the cron expression \"{source}\"{rest}"))
    } else {
        Err(format!("invalid cron expression \"{source}\": {error}"))
    }
}

/// The period of an `every` schedule in milliseconds.
fn check_every(text: &str) -> Result<u64, String> {
    match parse_millis(text) {
        Ok(millis) if millis >= MIN_EVERY_MILLIS => Ok(millis),
        Ok(_) => Err(format!(
            "`every` must be at least 1s, found \"{}\": e.g. `every = \"1s\"` or `every = \"30s\"`",
            text.trim()
        )),
        Err(problem) => Err(format!("`every`: {problem}")),
    }
}

/// `true` for `"none"`, `false` for `"once"`.
fn parse_catch_up(text: &str) -> Result<bool, String> {
    match text {
        "once" => Ok(false),
        "none" => Ok(true),
        other => Err(format!(
            "`catch_up` must be \"once\" (run once for all the fire times missed while no scheduler \
             was running; the default) or \"none\" (skip them), found {other:?}"
        )),
    }
}

/// Job names follow the rules of handler names.
fn check_job_name(name: &str) -> Result<(), String> {
    check_name(
        name,
        "\"billing::sync\"",
        "it identifies the job in the store",
    )
}

const USAGE: &str =
    "a scheduled job takes the context, then any state: `async fn name(ctx: &Context)` or `async fn name(ctx: &Context, db: State<PgPool>)`";

fn validate_fn<'a>(function: &'a ItemFn, cx: &mut Ctxt) -> Option<JobFn<'a>> {
    let sig = &function.sig;
    check_plain_async_fn(
        sig,
        cx,
        &FnRules {
            attribute: "`#[scheduled]`",
            parameters: "(ctx: &Context)",
            caller: "scheduler",
            generic_advice: "the scheduler calls one concrete function; share code through a \
                             generic helper that the job calls",
        },
    );

    let mut typed = Vec::new();
    let mut receiver = false;
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(self_arg) => {
                receiver = true;
                cx.error_spanned_by(
                    self_arg,
                    "`#[scheduled]` goes on a free function, not a method: move it out of the `impl` \
                     block, into an `async fn name(ctx: &Context)` that calls the method if needed",
                );
            }
            FnArg::Typed(typed_arg) => typed.push(typed_arg),
        }
    }
    if typed.is_empty() && !receiver {
        cx.error_at(
            sig.paren_token.span.join(),
            format!("missing the `&Context` parameter: {USAGE}"),
        );
    }
    if check_context_position(sig, &typed, 0, cx) {
        return None;
    }
    let state_tys = crate::handler::state_parameters(typed.iter().skip(1).map(|arg| &**arg), cx);

    let context_ty = typed.first().map(|arg| &*arg.ty);
    if let Some(context_ty) = context_ty {
        let wrong = || {
            format!(
                "the parameter must be `&Context` (a reference), found `{}`",
                types::display(context_ty)
            )
        };
        match types::peel(context_ty) {
            Type::Reference(reference) if reference.mutability.is_some() => cx.error_spanned_by(
                reference,
                "the context is shared: take `&Context`, not `&mut Context`",
            ),
            Type::Reference(reference) => {
                if let Some(Unowned::ImplTrait(_)) = types::find_unowned(&reference.elem) {
                    cx.error_spanned_by(reference, wrong());
                }
            }
            // Any other named type may be an alias of `&Context`: the generated code has the
            // compiler check it, except `Context` by value, a common slip.
            Type::Path(path) if !is_context_by_value(path) => {}
            other => cx.error_spanned_by(other, wrong()),
        }
    }

    // `_` in the return type is reported by the compiler on the function itself; the
    // registration would only repeat it.
    let mut placeholder = false;
    let output_ty = match &sig.output {
        ReturnType::Type(_, ty) => {
            placeholder = matches!(types::find_unowned(ty), Some(Unowned::Placeholder));
            Some(&**ty)
        }
        ReturnType::Default => {
            cx.error_at(
                sig.paren_token.span.close(),
                "a scheduled job must say how the run went: add `-> Result<(), E>` (E: Display; \
                 `Err` retries) or `-> hexeract::HandlerOutcome`",
            );
            None
        }
    };

    if cx.has_errors() || placeholder {
        return None;
    }
    Some(JobFn {
        ident: &sig.ident,
        context_ty: context_ty?,
        state_tys: state_tys?,
        output_ty: output_ty?,
    })
}

fn is_context_by_value(path: &TypePath) -> bool {
    path.qself.is_none()
        && path
            .path
            .segments
            .last()
            .is_some_and(|segment| segment.ident == "Context" && segment.arguments.is_empty())
}

fn generate(args: &ScheduleArgs, job: &JobFn<'_>) -> TokenStream {
    let JobFn {
        ident,
        context_ty,
        state_tys,
        output_ty,
    } = job;
    let krate = &args.krate;
    let private = quote!(#krate::__private);

    let name = match &args.name {
        Some(name) => quote!(#name),
        None => {
            // `r#match` is named `…::match`.
            let fn_name = ident.unraw().to_string();
            quote!(::core::concat!(::core::module_path!(), "::", #fn_name))
        }
    };
    let (cron, every_millis) = match &args.when {
        When::Cron(expression) => (quote!(::core::option::Option::Some(#expression)), 0),
        When::Every(millis) => (quote!(::core::option::Option::None), *millis),
    };
    let tz = &args.tz;
    let catch_up = if args.catch_up_none {
        quote!(#private::CatchUp::None)
    } else {
        quote!(#private::CatchUp::Once)
    };
    let timeout = match args.timeout_millis {
        Some(millis) => {
            quote!(::core::option::Option::Some(::core::time::Duration::from_millis(#millis)))
        }
        None => quote!(::core::option::Option::None),
    };

    // Locals resolve at `mixed_site`, so that nothing in the user's scope (or the hygiene of a
    // `macro_rules!` the job is declared in) can capture them.
    let ctx = Ident::new("__hexeract_ctx", Span::mixed_site());
    // The result of the call, spanned at the return type: a type that is not an outcome is
    // reported there.
    let outcome = Ident::new(
        "__hexeract_outcome",
        Span::mixed_site().located_at(output_ty.span()),
    );

    // The parameter is converted through a trait of its own (`JobContext`), so that a
    // parameter of another type is one error, spanned at it, that names a scheduled job's
    // signature.
    let context_span = match types::peel(context_ty) {
        Type::Reference(reference) => reference.elem.span(),
        other => other.span(),
    };
    let private_at_context = respan(&private, context_span);
    let call_context = quote_spanned! {context_span=> #private_at_context::job_context(#ctx) };
    let job = Ident::new("__HexeractJob", Span::call_site());
    let (job_definition, call_args) = crate::state::adapter(&job, state_tys, &private, "job_state");
    let call = quote_spanned! {ident.span()=> #ident(#call_context #(, #call_args)*) };
    let location = quote_spanned! {ident.span()=>
        file: ::core::file!(),
        line: ::core::line!(),
        column: ::core::column!(),
    };

    // Named, not `const _`: the one item that is valid in an `impl` block as well, so that
    // `#[scheduled]` on an associated function is one error, the call that cannot find it,
    // rather than a second about an unnamed `const` the user never wrote.
    let registration = format_ident!("__HEXERACT_JOB_{}", ident);
    quote! {
        #[doc(hidden)]
        #[allow(non_camel_case_types, non_upper_case_globals, unreachable_pub, deprecated)]
        const #registration: () = {
            /// The job's future runs on the scheduler's threads.
            fn future_must_be_send<F: ::core::future::Future + ::core::marker::Send>(future: F) -> F {
                future
            }

            #job_definition

            impl #private::ErasedJob for __HexeractJob {
                fn run<'a>(
                    &'a self,
                    #ctx: &'a #private::Context,
                ) -> #private::BoxFuture<'a, #private::HandlerOutcome> {
                    ::std::boxed::Box::pin(async move {
                        let #outcome = future_must_be_send(#call).await;
                        #private::job_outcome(#outcome)
                    })
                }
            }

            const __HEXERACT_MAKE: #private::MakeJob = #private::job::<__HexeractJob>();

            #private::inventory::submit! {
                #private::ScheduleRegistration {
                    name: #name,
                    cron: #cron,
                    every_millis: #every_millis,
                    tz: #tz,
                    catch_up: #catch_up,
                    timeout: #timeout,
                    #location
                    make: __HEXERACT_MAKE,
                }
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::{check_cron, check_every, check_job_name, parse_args, parse_catch_up, When};
    use crate::ctxt::Ctxt;
    use proc_macro2::{Span, TokenStream};
    use quote::quote;
    use syn::Ident;

    /// The parsed arguments, or every error message.
    fn parse(tokens: TokenStream) -> Result<(When, String, bool), String> {
        let mut cx = Ctxt::default();
        let fn_ident = Ident::new("sync", Span::call_site());
        let args = parse_args(tokens, &fn_ident, &mut cx);
        match cx.into_compile_errors() {
            Some(errors) => Err(errors.to_string()),
            None => {
                let args = args.expect("no errors means arguments");
                Ok((args.when, args.tz, args.catch_up_none))
            }
        }
    }

    #[test]
    fn parses_each_key() {
        assert_eq!(
            parse(quote!(cron = "0 */5 * * * *")),
            Ok((
                When::Cron("0 */5 * * * *".to_owned()),
                "UTC".to_owned(),
                false
            ))
        );
        assert_eq!(
            parse(quote!(
                cron = "0 30 2 * * *",
                tz = "Europe/Berlin",
                catch_up = "none"
            )),
            Ok((
                When::Cron("0 30 2 * * *".to_owned()),
                "Europe/Berlin".to_owned(),
                true
            ))
        );
        assert_eq!(
            parse(quote!(
                every = "1m30s",
                name = "billing::sync",
                timeout = "10s"
            )),
            Ok((When::Every(90_000), "UTC".to_owned(), false))
        );
    }

    #[test]
    fn reports_every_problem_at_once() {
        let errors = parse(quote!(
            every = "500ms",
            tz = "Europe/Berlin",
            catch_up = "always",
            timout = "1s"
        ))
        .unwrap_err();
        for expected in [
            "`every` must be at least 1s",
            "`tz` applies to `cron` schedules only",
            "`catch_up` must be",
            "did you mean `timeout`?",
        ] {
            assert!(errors.contains(expected), "{expected:?} not in {errors}");
        }
        let errors = parse(quote!(cron = "* * * * * *", every = "1s")).unwrap_err();
        assert!(errors.contains("not both"), "{errors}");
        let errors = parse(quote!(name = "x")).unwrap_err();
        assert!(errors.contains("needs a schedule"), "{errors}");
        // A misspelt key may be the schedule: only the typo is reported.
        let errors = parse(quote!(corn = "* * * * * *")).unwrap_err();
        assert!(errors.contains("did you mean `cron`?"), "{errors}");
        assert!(!errors.contains("needs a schedule"), "{errors}");
    }

    #[test]
    fn cron_errors_quote_the_expression_once() {
        assert_eq!(check_cron("0 */5 * * * *"), Ok(()));
        let error = check_cron("0 */5 * * *").unwrap_err();
        assert!(
            error.starts_with("invalid cron expression \"0 */5 * * *\": expected 6 fields"),
            "{error}"
        );
        let error = check_cron("0 0 0 30 2 *").unwrap_err();
        assert_eq!(
            error,
            "the cron expression \"0 0 0 30 2 *\" never fires: February has no day 30"
        );
        let error = check_cron("@daily").unwrap_err();
        assert!(
            error.starts_with("invalid cron expression \"@daily\": the macro"),
            "{error}"
        );
        let error = check_cron("  ").unwrap_err();
        assert!(error.starts_with("the cron expression is empty"), "{error}");
    }

    #[test]
    fn every_is_a_duration_of_at_least_one_second() {
        assert_eq!(check_every("1s"), Ok(1_000));
        assert_eq!(check_every("1500ms"), Ok(1_500));
        assert!(check_every("999ms").unwrap_err().contains("at least 1s"));
        assert!(check_every("0s").unwrap_err().contains("at least 1s"));
        assert!(check_every("soon")
            .unwrap_err()
            .starts_with("`every`: invalid duration"));
    }

    #[test]
    fn catch_up_and_names() {
        assert_eq!(parse_catch_up("once"), Ok(false));
        assert_eq!(parse_catch_up("none"), Ok(true));
        assert!(parse_catch_up("Once").is_err());
        assert!(check_job_name("billing::sync").is_ok());
        assert!(check_job_name("carts.expire-v2").is_ok());
        assert!(check_job_name("").is_err());
        assert!(check_job_name("nightly report").is_err());
    }
}
