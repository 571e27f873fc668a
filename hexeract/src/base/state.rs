//! State for handlers: values a worker is given once ([`States`]) and its handlers take as
//! [`State<T>`] parameters, the way axum's handlers take theirs.
//!
//! Each handler's state is looked up when its worker is built, not per call: a handler holds
//! its own clone of each value it takes, and a call clones it once more (for a pool or a
//! client, an `Arc` increment). A handler whose state was not given stops the build with an
//! error naming every such handler and type ([`RegistryError::MissingState`]).
//!
//! [`RegistryError::MissingState`]: crate::RegistryError::MissingState

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::ops::{Deref, DerefMut};

/// A value of type `T` the worker was given with `.state(value)`, as a handler's (or scheduled
/// job's) parameter after the context.
///
/// ```
/// use hexeract::{handler, Context, Message, State};
///
/// #[derive(Clone)]
/// struct Warehouse { name: String }
///
/// #[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
/// #[message(type = "OrderPlaced")]
/// struct OrderPlaced { order_id: u64 }
///
/// #[handler(message = "OrderPlaced")]
/// async fn reserve_stock(
///     event: OrderPlaced,
///     ctx: &Context,
///     State(warehouse): State<Warehouse>,
/// ) -> Result<(), std::io::Error> {
///     println!("{}: reserve order {}", warehouse.name, event.order_id);
///     Ok(())
/// }
/// ```
///
/// `T` is cloned for each call: share what is costly to clone (`Arc<T>`; pools and clients
/// such as `sqlx::PgPool` are already shared).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct State<T>(pub T);

impl<T> Deref for State<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> DerefMut for State<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

/// The state a worker was given: one value per type.
///
/// Builders fill it with `.state(value)`; [`App`](crate::App) and every worker builder
/// have that method.
///
/// ```
/// use hexeract::States;
///
/// let mut states = States::new();
/// states.insert(String::from("eu-west"));
/// assert_eq!(states.get::<String>().map(String::as_str), Some("eu-west"));
/// assert!(states.get::<u32>().is_none());
/// ```
#[derive(Clone, Default)]
pub struct States {
    values: HashMap<TypeId, Entry>,
}

#[derive(Clone)]
struct Entry {
    value: std::sync::Arc<dyn Any + Send + Sync>,
    type_name: &'static str,
}

impl States {
    /// No state.
    pub fn new() -> States {
        States::default()
    }

    /// Adds `value`; returns the value of that type given before, if any.
    pub fn insert<T: Clone + Send + Sync + 'static>(&mut self, value: T) -> Option<T> {
        let entry = Entry {
            value: std::sync::Arc::new(value),
            type_name: std::any::type_name::<T>(),
        };
        self.values
            .insert(TypeId::of::<T>(), entry)
            .and_then(|old| old.value.downcast_ref::<T>().cloned())
    }

    /// The value of type `T`, if one was given.
    pub fn get<T: Send + Sync + 'static>(&self) -> Option<&T> {
        self.values
            .get(&TypeId::of::<T>())
            .and_then(|entry| entry.value.downcast_ref::<T>())
    }

    /// Adds every value of `other` (its values win).
    pub(crate) fn extend(&mut self, other: &States) {
        for (id, entry) in &other.values {
            self.values.insert(*id, entry.clone());
        }
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// `true` when no value was given.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

impl fmt::Debug for States {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<&str> = self.values.values().map(|entry| entry.type_name).collect();
        names.sort_unstable();
        f.debug_set().entries(names).finish()
    }
}

/// What a handler's parameter after the context may be: state. Implemented for [`State<T>`];
/// not meant to be implemented elsewhere.
#[diagnostic::on_unimplemented(
    message = "the parameters after `&Context` are state, `State<T>`, not `{Self}`",
    label = "expected `State<…>`",
    note = "take it as `name: State<T>` (or `State(name): State<T>`) and give the value to the worker with `.state(value)`, e.g. `async fn reserve_stock(event: OrderPlaced, ctx: &Context, db: State<PgPool>)` and `App::new(config).state(pool)`"
)]
pub trait FromStates: Clone + Send + Sync + 'static {
    /// The value, or the name of the type that is missing.
    fn from_states(states: &States) -> Result<Self, &'static str>;
}

impl<T: Clone + Send + Sync + 'static> FromStates for State<T> {
    fn from_states(states: &States) -> Result<Self, &'static str> {
        states
            .get::<T>()
            .cloned()
            .map(State)
            .ok_or(std::any::type_name::<T>())
    }
}

/// The state a handler or job needs, taken once when its worker is built; missing types are
/// pushed to `missing`.
pub(crate) fn take<T: FromStates>(states: &States, missing: &mut Vec<&'static str>) -> Option<T> {
    match T::from_states(states) {
        Ok(value) => Some(value),
        Err(type_name) => {
            missing.push(type_name);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_per_type_the_last_one_wins() {
        let mut states = States::new();
        assert_eq!(states.insert(1_u32), None);
        assert_eq!(states.insert(2_u32), Some(1));
        states.insert("text");
        assert_eq!(states.get::<u32>(), Some(&2));
        assert_eq!(states.len(), 2);
        assert_eq!(format!("{states:?}"), r#"{"&str", "u32"}"#);
    }

    #[test]
    fn state_is_taken_or_named_as_missing() {
        let mut states = States::new();
        states.insert(String::from("pool"));
        let mut missing = Vec::new();
        let found: Option<State<String>> = take(&states, &mut missing);
        assert_eq!(found.as_deref().map(String::as_str), Some("pool"));
        let absent: Option<State<u64>> = take(&states, &mut missing);
        assert!(absent.is_none());
        assert_eq!(missing, ["u64"]);
    }
}
