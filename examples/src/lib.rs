//! Runnable gdaki examples live beside this crate as `[[example]]` targets.
