//! Every accepted `#[scheduled]` form compiles and registers what it says.
use hexeract::__private::{inventory, ScheduleRegistration};
use hexeract::{scheduled, Context, HandlerOutcome, Message};

/// Only to build a context for calling the registered functions.
#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "Tick")]
pub struct Tick {}

/// Every five minutes, at second 0.
#[scheduled(cron = "0 */5 * * * *")]
async fn expire_carts(_ctx: &Context) -> Result<(), std::io::Error> {
    Ok(())
}

#[scheduled(
    every = "30s",
    name = "billing::sync",
    catch_up = "none",
    timeout = "10s"
)]
async fn sync(_ctx: &Context) -> anyhow::Result<()> {
    Ok(())
}

#[scheduled(cron = "0 30 2 * * *", tz = "Europe/Berlin")]
async fn nightly(_ctx: &Context) -> HandlerOutcome {
    HandlerOutcome::Ack
}

#[scheduled(every = "1h", catch_up = "once")]
pub async fn with_outcome_result(ctx: &hexeract::Context) -> Result<HandlerOutcome, String> {
    match ctx.scheduled_for() {
        Some(_) => Ok(HandlerOutcome::Ack),
        None => Err("not a scheduled run".to_owned()),
    }
}

pub mod reports {
    pub mod weekly {
        use hexeract::{scheduled, Context};

        /// Names like what the expansion introduces do not get in its way.
        #[allow(dead_code, non_camel_case_types)]
        struct JobContext;
        #[allow(dead_code, non_upper_case_globals)]
        const ctx: u8 = 0;

        #[scheduled(cron = "0 0 8 * * MON-FRI", tz = "America/New_York", timeout = "2m")]
        pub(crate) async fn summary(_ctx: &Context) -> Result<(), String> {
            Ok(())
        }
    }
}

/// An alias of `&Context` is `&Context`.
type Ctx<'a> = &'a Context;

/// Named `crate::loop`: the raw prefix is not part of the name.
#[scheduled(every = "1500ms")]
async fn r#loop(_ctx: Ctx<'_>) -> Result<(), String> {
    Ok(())
}

/// A job written inside `macro_rules!`, its schedule passed as a `$lit:literal`.
macro_rules! every_job {
    ($name:ident, $every:literal) => {
        #[scheduled(every = $every)]
        async fn $name(ctx: &Context) -> Result<(), String> {
            let _ = ctx.scheduled_for();
            Ok(())
        }
    };
}

every_job!(from_macro, "2m");

#[deprecated = "calling a deprecated job from the expansion does not warn"]
#[scheduled(cron = "0 0 0 1 1 *")]
async fn yearly(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

fn main() {
    let crate_name = module_path!();
    let mut registrations: Vec<&ScheduleRegistration> = inventory::iter::<ScheduleRegistration>
        .into_iter()
        .collect();
    registrations.sort_by_key(|registration| registration.name);
    let summary: Vec<String> = registrations
        .iter()
        .map(|r| {
            let schedule = match r.cron {
                Some(cron) => format!("cron {cron:?} in {}", r.tz),
                None => format!("every {} ms in {}", r.every_millis, r.tz),
            };
            let name = r.name.replace(crate_name, "crate");
            format!(
                "{name}: {schedule}, {:?}, timeout {:?}",
                r.catch_up, r.timeout
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            "billing::sync: every 30000 ms in UTC, None, timeout Some(10s)",
            "crate::expire_carts: cron \"0 */5 * * * *\" in UTC, Once, timeout None",
            "crate::from_macro: every 120000 ms in UTC, Once, timeout None",
            "crate::loop: every 1500 ms in UTC, Once, timeout None",
            "crate::nightly: cron \"0 30 2 * * *\" in Europe/Berlin, Once, timeout None",
            "crate::reports::weekly::summary: cron \"0 0 8 * * MON-FRI\" in America/New_York, Once, timeout Some(120s)",
            "crate::with_outcome_result: every 3600000 ms in UTC, Once, timeout None",
            "crate::yearly: cron \"0 0 0 1 1 *\" in UTC, Once, timeout None",
        ]
    );

    // The location is the function's name.
    let nightly = registrations
        .iter()
        .find(|r| r.name.ends_with("::nightly"))
        .unwrap();
    assert!(
        nightly.file.ends_with("scheduled_forms.rs"),
        "{}",
        nightly.file
    );
    assert_eq!((nightly.line, nightly.column), (27, 10));

    // The runtime accepts every registration.
    let jobs = hexeract::schedule::jobs_from_inventory().expect("valid jobs");
    assert_eq!(jobs.len(), 8);

    // The registered function calls the job and turns its result into an outcome.
    let harness = hexeract::testing::Harness::new().expect("harness");
    let ctx = harness.context_for(&Tick {}).expect("context");
    let run = |suffix: &str| {
        let registration = registrations
            .iter()
            .find(|r| r.name.ends_with(suffix))
            .unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let job = (registration.make)(&hexeract::States::new(), &mut Vec::new())
            .expect("a job without state builds without any");
        runtime.block_on(hexeract::__private::ErasedJob::run(&*job, &ctx))
    };
    assert_eq!(run("::nightly"), HandlerOutcome::Ack);
    assert_eq!(run("::expire_carts"), HandlerOutcome::Ack);
    assert_eq!(
        run("::with_outcome_result"),
        HandlerOutcome::retry("not a scheduled run")
    );
}
