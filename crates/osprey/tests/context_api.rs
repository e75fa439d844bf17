//! The thread-level context API: set/clear/current, scope guards, tags, and
//! the writer's record cache surviving record recycling.

use osprey::context::{self, ContextSnapshot, TAG_SLOTS};
use osprey::internals::registry::Registry;

fn ids() -> Option<(u64, u64)> {
    context::current().map(|c| (c.span_id, c.local_root_span_id))
}

#[test]
fn set_current_clear() {
    std::thread::spawn(|| {
        assert_eq!(context::current(), None);
        context::set(7, 3);
        assert_eq!(ids(), Some((7, 3)));
        // The handler-side read of this thread's record agrees.
        let (_, rec) = Registry::get().unwrap().lookup(osprey::internals::signal::sys::gettid()).unwrap();
        assert_eq!(rec.context.read(), context::current());
        context::clear();
        assert_eq!(context::current(), None);
        assert_eq!(rec.context.read(), None);
    })
    .join()
    .unwrap();
}

#[test]
fn threads_are_independent() {
    let a = std::thread::spawn(|| {
        context::set(1, 1);
        std::thread::sleep(std::time::Duration::from_millis(20));
        ids()
    });
    let b = std::thread::spawn(|| {
        context::set(2, 2);
        std::thread::sleep(std::time::Duration::from_millis(20));
        ids()
    });
    assert_eq!(a.join().unwrap(), Some((1, 1)));
    assert_eq!(b.join().unwrap(), Some((2, 2)));
}

#[test]
fn scope_restores_ids_and_tags() {
    std::thread::spawn(|| {
        context::set(1, 1);
        context::set_tag("api-endpoint", "/a").unwrap();
        let before = context::current();
        {
            let _g = context::scope(2, 1);
            assert_eq!(ids(), Some((2, 1)));
            {
                let _g = context::scope(3, 1);
                context::set_tag("api-endpoint", "/b").unwrap();
                assert_eq!(ids(), Some((3, 1)));
            }
            assert_eq!(ids(), Some((2, 1)));
            let slot = context::find_tag_key("api-endpoint").unwrap();
            let v = context::current().unwrap().tags[slot];
            assert_eq!(context::tag_value(v).as_deref(), Some("/a"), "inner tag change undone");
        }
        assert_eq!(context::current(), before);
        context::clear_all();
        {
            let _g = context::scope(9, 9);
        }
        assert_eq!(context::current(), None, "restores 'no context' too");
    })
    .join()
    .unwrap();
}

#[test]
fn tags_set_clear_and_export_lookup() {
    std::thread::spawn(|| {
        context::set_tag("api-region", "eu").unwrap();
        let slot = context::tag_key("api-region").unwrap();
        assert_eq!(context::tag_key_name(slot).as_deref(), Some("api-region"));
        let c = context::current().unwrap();
        assert_eq!((c.span_id, c.local_root_span_id), (0, 0), "tags without a span");
        assert_eq!(context::tag_value(c.tags[slot]).as_deref(), Some("eu"));
        assert_eq!(context::intern_value("eu"), c.tags[slot], "interned once");
        context::set(5, 5);
        assert_eq!(context::current().unwrap().tags[slot], c.tags[slot], "set keeps tags");
        context::clear_tag("api-region").unwrap();
        assert_eq!(context::current().unwrap().tags, [0; TAG_SLOTS]);
        context::clear();
        assert_eq!(context::current(), None);
        assert_eq!(context::set_tag("", "x"), Err(context::TagError::BadKey));
        assert_eq!(context::set_tag_id(TAG_SLOTS, 1), Err(context::TagError::BadKey));
        assert_eq!(context::tag_value(0), None);
    })
    .join()
    .unwrap();
}

#[test]
fn cache_follows_record_recycling() {
    std::thread::spawn(|| {
        context::set(11, 11);
        let reg = Registry::get().unwrap();
        let (idx, old) = reg.lookup(osprey::internals::signal::sys::gettid()).unwrap();
        // Pretend this thread exited and its record was reused.
        assert!(reg.retire(osprey::internals::signal::sys::gettid()));
        reg.recycle(idx);
        assert_eq!(old.context.read(), None, "recycled record was reset");
        context::set(12, 12);
        let (_, new) = reg.lookup(osprey::internals::signal::sys::gettid()).expect("re-registered on the next write");
        assert_eq!(
            new.context.read(),
            Some(ContextSnapshot { span_id: 12, local_root_span_id: 12, tags: [0; TAG_SLOTS], ..Default::default() })
        );
    })
    .join()
    .unwrap();
}
