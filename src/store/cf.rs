//! The store's column families: their names, and the two slots the dictionary's derived
//! families alternate between.

/// The column families, declared once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cf {
    Users,
    Rows,
    Retrieval,
    Activation,
    Log,
    Counts,
    Clock,
    Chain,
    Bindings,
    Meta,
    Warm,
    /// The dark dictionary version's retrieval rows (the slot that does not serve).
    DarkRetrieval,
    /// The dark dictionary version's frequency counts.
    DarkCounts,
    /// Rows a user excluded from its own recall (kept, never shown).
    Exclusions,
    /// A sub-user's link to its credential's own user, so a purge of the credential can find
    /// its sub-users without the credential being stored.
    Owners,
}

/// The physical families of the two slots: `[retrieval, counts]` each.
pub(super) const SLOTS: [[&str; 2]; 2] = [["retrieval", "counts"], ["retrieval_1", "counts_1"]];
/// A key above every key of the slotted families (their keys are at most 16 bytes): the end
/// of a range that clears one.
pub(super) const ALL_KEYS_END: [u8; 17] = [0xff; 17];

impl Cf {
    pub const ALL: [Cf; 15] = [
        Cf::Users,
        Cf::Rows,
        Cf::Retrieval,
        Cf::Activation,
        Cf::Log,
        Cf::Counts,
        Cf::Clock,
        Cf::Chain,
        Cf::Bindings,
        Cf::Meta,
        Cf::Warm,
        Cf::DarkRetrieval,
        Cf::DarkCounts,
        Cf::Exclusions,
        Cf::Owners,
    ];

    /// The family's name in reports. The four slotted families are named by role
    /// (`retrieval`, `counts`, `dark_retrieval`, `dark_counts`); their physical families on
    /// disk depend on the serving slot.
    pub fn name(self) -> &'static str {
        match self {
            Cf::Users => "users",
            Cf::Rows => "rows",
            Cf::Retrieval => "retrieval",
            Cf::Activation => "activation",
            Cf::Log => "log",
            Cf::Counts => "counts",
            Cf::Clock => "clock",
            Cf::Chain => "chain",
            Cf::Bindings => "bindings",
            Cf::Meta => "meta",
            Cf::Warm => "warm",
            Cf::DarkRetrieval => "dark_retrieval",
            Cf::DarkCounts => "dark_counts",
            Cf::Exclusions => "exclusions",
            Cf::Owners => "owners",
        }
    }

    /// The family on disk when slot `serving` serves.
    pub(super) fn physical(self, serving: usize) -> &'static str {
        match self {
            Cf::Retrieval => SLOTS[serving][0],
            Cf::Counts => SLOTS[serving][1],
            Cf::DarkRetrieval => SLOTS[1 - serving][0],
            Cf::DarkCounts => SLOTS[1 - serving][1],
            other => other.name(),
        }
    }

    /// Families whose keys all start with the user id.
    pub(super) const PER_USER: [Cf; 11] = [
        Cf::Users,
        Cf::Rows,
        Cf::Retrieval,
        Cf::DarkRetrieval,
        Cf::Activation,
        Cf::Clock,
        Cf::Chain,
        Cf::Bindings,
        Cf::Warm,
        Cf::Exclusions,
        Cf::Owners,
    ];
}
