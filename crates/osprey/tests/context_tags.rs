//! Tag key slots run out after TAG_SLOTS names (own binary: keys are global).

use osprey::context::{self, TagError, TAG_SLOTS};

#[test]
fn at_most_tag_slots_keys() {
    for i in 0..TAG_SLOTS {
        assert_eq!(context::tag_key(&format!("k{i}")), Some(i));
    }
    assert_eq!(context::tag_key("k3"), Some(3), "existing key keeps its slot");
    assert_eq!(context::tag_key("one-too-many"), None);
    assert_eq!(context::set_tag("one-too-many", "v"), Err(TagError::BadKey));
    assert_eq!(context::tag_key(&"x".repeat(context::MAX_KEY_LEN + 1)), None);
    context::set_tag("k9", "v").unwrap();
    assert_eq!(context::tag_key_name(9).as_deref(), Some("k9"));
    assert_eq!(context::tag_key_name(TAG_SLOTS), None);
}
