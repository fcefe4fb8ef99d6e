//! The shipped dictionary: it loads, derivation is deterministic to the byte, and every kind of
//! damage to its files is refused with a typed error that names the file.

mod common;

use std::path::Path;

use perpetuity::dictionary::derive::{RetrievalRow, derive, embed};
use perpetuity::dictionary::stats::FrequencyTable;
use perpetuity::dictionary::{
    DEFAULT_DENSE_WEIGHT, Dictionary, DictionaryError, MANIFEST_FILE, TABLE_FILE,
};
use perpetuity::tokens::{self, Tokenizer};
use perpetuity::types::TokenId;
use proptest::prelude::*;
use serde_json::json;
use sha2::{Digest, Sha256};

/// A writable copy of the shipped dictionary in a fresh temp dir.
fn copy_of_shipped() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for file in [MANIFEST_FILE, TABLE_FILE] {
        std::fs::copy(common::dictionary_dir().join(file), dir.path().join(file)).unwrap();
    }
    dir
}

fn edit_manifest(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join(MANIFEST_FILE);
    let mut value: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut value);
    std::fs::write(path, serde_json::to_vec_pretty(&value).unwrap()).unwrap();
}

/// Rewrite the table and record its new size and hash, so only the table's own checks can
/// catch what was done to it.
fn rewrite_table_consistently(dir: &Path, bytes: &[u8]) {
    std::fs::write(dir.join(TABLE_FILE), bytes).unwrap();
    let sha = tokens::hex(&Sha256::digest(bytes));
    edit_manifest(dir, |m| {
        m["files"][TABLE_FILE]["sha256"] = sha.into();
        m["files"][TABLE_FILE]["bytes"] = bytes.len().into();
    });
}

#[test]
fn shipped_dictionary_loads_and_is_consistent() {
    let dict = common::dictionary();
    let m = dict.manifest();
    assert_eq!(m.tokenizer.name, tokens::TOKENIZER_NAME);
    assert_eq!(m.tokenizer.sha256, Tokenizer::new().fingerprint());
    assert_eq!(dict.rows(), m.rows as usize);
    assert!(dict.rows() > 100_000, "table has {} rows", dict.rows());
    // A common English word has a vector; the vector is not all zeros.
    let the = Tokenizer::new().encode(" the");
    let (scale, values) = dict.vector(the[0]).expect("' the' has a vector");
    assert!(scale > 0.0 && values.iter().any(|&v| v != 0));
}

#[test]
fn derivation_is_deterministic_to_the_byte() {
    let dict = common::dictionary();
    let tokenizer = Tokenizer::new();
    let tokens = tokenizer.encode("Melanie painted a sunrise over the lake last weekend.");
    let a = derive(dict, &tokenizer, None, &tokens);
    let b = derive(dict, &tokenizer, None, &tokens);
    assert_eq!(a.encode(), b.encode());
    let stats = FrequencyTable::default();
    let (ea, eb) = (embed(dict, &stats, &a), embed(dict, &stats, &b));
    let bits = |e: &[f32]| e.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&ea.unit), bits(&eb.unit));
    // A freshly loaded copy of the same dictionary gives the same bytes too.
    let again = Dictionary::load(&common::dictionary_dir()).unwrap();
    let c = derive(&again, &tokenizer, None, &tokens);
    assert_eq!(c.encode(), a.encode());
    assert_eq!(bits(&embed(&again, &stats, &c).unit), bits(&ea.unit));
}

/// (a text, one on the same topic in other words, one on another topic), over everyday
/// topics: a table that embeds text sensibly puts the second nearer the first than the third.
const TRIPLES: [(&str, &str, &str); 40] = [
    (
        "My dog loves running in the park.",
        "The puppy plays fetch outside every morning.",
        "Quarterly tax filings are due to the revenue office.",
    ),
    (
        "I baked a chocolate cake for her birthday.",
        "The dessert had frosting and candles on top.",
        "The server crashed after the kernel update.",
    ),
    (
        "We flew to Paris for our holiday.",
        "The trip to France was a lovely vacation.",
        "He fixed the leaking pipe under the sink.",
    ),
    (
        "The Rust compiler rejected my borrow.",
        "The borrow checker complains about lifetimes.",
        "She planted tomatoes in the garden.",
    ),
    (
        "My knee hurts after the marathon.",
        "Running long distances strained my leg.",
        "The invoice lists three unpaid items.",
    ),
    (
        "The stock market fell sharply today.",
        "Shares dropped as investors sold.",
        "Our cat sleeps on the windowsill.",
    ),
    (
        "I started learning the guitar.",
        "Practising chords on my new instrument is hard.",
        "The database index speeds up queries.",
    ),
    (
        "The baby cried all night.",
        "Our newborn would not sleep.",
        "The contract expires in March.",
    ),
    (
        "It rained heavily during the storm.",
        "The thunderstorm flooded the streets.",
        "I sorted the list with quicksort.",
    ),
    (
        "She is studying for the medical exam.",
        "Preparing for the doctor's licensing test takes months.",
        "The bakery sells sourdough bread.",
    ),
    (
        "The car needs new tyres.",
        "I took the vehicle to the mechanic for wheels.",
        "The poem is about lost love.",
    ),
    (
        "We adopted a kitten from the shelter.",
        "The rescue cat came home with us.",
        "The quarterly budget was approved.",
    ),
    (
        "Python raised a KeyError in my script.",
        "The dictionary lookup failed with a missing key.",
        "The choir sang at the wedding.",
    ),
    (
        "I go swimming every weekend.",
        "Laps in the pool keep me fit.",
        "The spreadsheet formula returns an error.",
    ),
    (
        "The painting shows a sunset over the sea.",
        "The artwork depicts the ocean at dusk.",
        "My phone battery drains quickly.",
    ),
    (
        "Our team won the football match.",
        "The soccer game ended in victory for us.",
        "She renewed her passport online.",
    ),
    (
        "I am allergic to peanuts.",
        "Nuts give me a bad reaction.",
        "The train to Berlin was delayed.",
    ),
    (
        "The museum exhibit featured dinosaur fossils.",
        "We saw ancient bones of a T. rex.",
        "I updated the firewall rules.",
    ),
    (
        "He proposed to her on the beach.",
        "They got engaged by the sea.",
        "The printer is out of toner.",
    ),
    (
        "The recipe needs two cups of flour.",
        "Add the flour and sugar to the dough.",
        "The election results were announced.",
    ),
    (
        "I moved into a new apartment downtown.",
        "My new flat is in the city centre.",
        "The algorithm runs in linear time.",
    ),
    (
        "The kids built a snowman.",
        "Children played in the snow all afternoon.",
        "The mortgage rate went up.",
    ),
    (
        "I'm reading a novel about pirates.",
        "The book follows sailors hunting treasure.",
        "The dentist filled my cavity.",
    ),
    (
        "The wifi keeps disconnecting.",
        "My internet connection drops every few minutes.",
        "We hiked up the mountain trail.",
    ),
    (
        "She volunteers at the animal shelter.",
        "She helps care for rescued dogs and cats.",
        "The GPU renders frames faster.",
    ),
    (
        "The concert was loud and exciting.",
        "The band played a great live show.",
        "Fill in the tax return form.",
    ),
    (
        "I lost my wallet on the bus.",
        "My purse was stolen during the commute.",
        "The cake recipe uses butter.",
    ),
    (
        "The patient has a high fever.",
        "His temperature is dangerously elevated.",
        "The bridge was painted red.",
    ),
    (
        "We are renovating the kitchen.",
        "New cabinets and countertops are being installed.",
        "The satellite orbits the earth.",
    ),
    (
        "The meeting was moved to Tuesday.",
        "We rescheduled the call for next week.",
        "Lions hunt on the savanna.",
    ),
    (
        "I enjoy painting landscapes with watercolors.",
        "Art is my favourite hobby; I paint nature scenes.",
        "The compiler emits a warning.",
    ),
    (
        "The flight was cancelled due to fog.",
        "Bad weather grounded our plane.",
        "She knitted a wool scarf.",
    ),
    (
        "My grandmother turned ninety.",
        "We celebrated grandma's birthday.",
        "The query returned no rows.",
    ),
    (
        "The function leaks memory in a loop.",
        "Allocations are never freed inside the iteration.",
        "We picnicked by the lake.",
    ),
    (
        "I've been feeling anxious lately.",
        "Stress and worry keep me up at night.",
        "The shipment arrived on time.",
    ),
    (
        "The garden is full of roses.",
        "Flowers are blooming in the yard.",
        "The API returns JSON.",
    ),
    (
        "He plays chess every evening.",
        "Board games like chess are his passion.",
        "The river flooded the village.",
    ),
    (
        "The bank approved my loan.",
        "I got the credit I applied for.",
        "The bird built a nest.",
    ),
    (
        "We watched a horror movie.",
        "The scary film kept us awake.",
        "The engine needs oil.",
    ),
    (
        "I switched to a vegan diet.",
        "I stopped eating meat and dairy.",
        "The server uses TLS certificates.",
    ),
];

/// Each triple's (related, unrelated) cosines under `stats`.
fn triple_cosines(stats: &FrequencyTable) -> Vec<(f32, f32)> {
    let dict = common::dictionary();
    let tokenizer = Tokenizer::new();
    let vec = |s: &str| {
        embed(
            dict,
            stats,
            &derive(dict, &tokenizer, None, &tokenizer.encode(s)),
        )
        .unit
    };
    let cos = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    TRIPLES
        .iter()
        .map(|(text, related, unrelated)| {
            let text = vec(text);
            (cos(&text, &vec(related)), cos(&text, &vec(unrelated)))
        })
        .collect()
}

#[test]
fn related_texts_are_closer_than_unrelated_ones() {
    // Under an empty statistic (a new memory: token weights from the prior alone) and under
    // the statistic of the triples' own texts (a memory that holds them).
    let mut own = FrequencyTable::default();
    for text in TRIPLES.iter().flat_map(|(a, b, c)| [a, b, c]) {
        let tokenizer = Tokenizer::new();
        derive(
            common::dictionary(),
            &tokenizer,
            None,
            &tokenizer.encode(text),
        )
        .count_into(&mut own);
    }
    for (name, stats) in [("empty", FrequencyTable::default()), ("own", own)] {
        let cosines = triple_cosines(&stats);
        let (dog_puppy, dog_tax) = cosines[0];
        assert!(
            dog_puppy > dog_tax + 0.1,
            "{name} statistic: {dog_puppy} vs {dog_tax}"
        );
        let margins: Vec<f32> = cosines
            .iter()
            .map(|(related, unrelated)| related - unrelated)
            .collect();
        let count = |floor: f32| margins.iter().filter(|&&margin| margin > floor).count();
        let (closer, wide) = (count(0.0), count(0.1));
        let mean = margins.iter().sum::<f32>() / margins.len() as f32;
        assert!(
            closer >= 38 && wide >= 36 && mean > 0.25,
            "{name} statistic: margins {margins:?} ({closer} above 0, {wide} above 0.1, mean {mean})"
        );
    }
}

#[test]
fn missing_folder_is_an_io_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let err = Dictionary::load(&dir.path().join("nope")).unwrap_err();
    assert!(matches!(err, DictionaryError::Io { .. }), "{err}");
    assert!(err.to_string().contains(MANIFEST_FILE));
}

#[test]
fn flipped_table_byte_fails_the_hash_check() {
    let dir = copy_of_shipped();
    let path = dir.path().join(TABLE_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let err = Dictionary::load(dir.path()).unwrap_err();
    assert!(matches!(err, DictionaryError::HashMismatch { .. }), "{err}");
    assert!(err.to_string().contains(TABLE_FILE));
}

#[test]
fn truncated_table_is_refused_even_with_a_matching_hash() {
    let dir = copy_of_shipped();
    let bytes = std::fs::read(dir.path().join(TABLE_FILE)).unwrap();
    // Truncated against the header's recorded size.
    std::fs::write(dir.path().join(TABLE_FILE), &bytes[..bytes.len() - 1]).unwrap();
    let err = Dictionary::load(dir.path()).unwrap_err();
    assert!(matches!(err, DictionaryError::Truncated { .. }), "{err}");
    // Truncated, with the header rewritten to match: the table's own length check catches it.
    rewrite_table_consistently(dir.path(), &bytes[..bytes.len() - 7]);
    let err = Dictionary::load(dir.path()).unwrap_err();
    assert!(matches!(err, DictionaryError::Truncated { .. }), "{err}");
    assert!(err.to_string().contains(TABLE_FILE));
}

#[test]
fn wrong_versions_are_refused() {
    let dir = copy_of_shipped();
    edit_manifest(dir.path(), |m| m["format_version"] = 2.into());
    let err = Dictionary::load(dir.path()).unwrap_err();
    assert!(
        matches!(
            err,
            DictionaryError::UnsupportedFormatVersion { found: 2, .. }
        ),
        "{err}"
    );

    let dir = copy_of_shipped();
    let mut bytes = std::fs::read(dir.path().join(TABLE_FILE)).unwrap();
    bytes[8..12].copy_from_slice(&9u32.to_le_bytes());
    rewrite_table_consistently(dir.path(), &bytes);
    let err = Dictionary::load(dir.path()).unwrap_err();
    assert!(
        matches!(
            err,
            DictionaryError::UnsupportedFormatVersion { found: 9, .. }
        ),
        "{err}"
    );
}

#[test]
fn bad_magic_and_unknown_fields_are_refused() {
    let dir = copy_of_shipped();
    let mut bytes = std::fs::read(dir.path().join(TABLE_FILE)).unwrap();
    bytes[0] = b'X';
    rewrite_table_consistently(dir.path(), &bytes);
    assert!(matches!(
        Dictionary::load(dir.path()),
        Err(DictionaryError::Corrupt { .. })
    ));

    let dir = copy_of_shipped();
    edit_manifest(dir.path(), |m| m["lexical"]["stem"] = "porter9000".into());
    assert!(matches!(
        Dictionary::load(dir.path()),
        Err(DictionaryError::Manifest { .. })
    ));

    let dir = copy_of_shipped();
    std::fs::write(dir.path().join(MANIFEST_FILE), b"{ not json").unwrap();
    assert!(matches!(
        Dictionary::load(dir.path()),
        Err(DictionaryError::Manifest { .. })
    ));
}

#[test]
fn the_dense_weight_travels_in_the_header_and_is_range_checked() {
    let dir = copy_of_shipped();
    edit_manifest(dir.path(), |m| {
        m.as_object_mut().unwrap().remove("hybrid");
    });
    assert_eq!(
        Dictionary::load(dir.path()).unwrap().dense_weight(),
        DEFAULT_DENSE_WEIGHT,
        "a header without a hybrid block"
    );
    edit_manifest(dir.path(), |m| m["hybrid"] = json!({"dense_weight": 0.25}));
    assert_eq!(Dictionary::load(dir.path()).unwrap().dense_weight(), 0.25);
    for bad in [
        json!({"dense_weight": 1.5}),
        json!({"dense_weight": -0.1}),
        json!({"dense_weight": "high"}),
        json!({"dense_weight": 0.3, "lexical_weight": 0.7}),
        json!({}),
    ] {
        edit_manifest(dir.path(), |m| m["hybrid"] = bad.clone());
        let err = Dictionary::load(dir.path()).unwrap_err();
        assert!(
            matches!(err, DictionaryError::Manifest { .. }),
            "{bad}: {err}"
        );
        assert!(err.to_string().contains(MANIFEST_FILE), "{err}");
    }
}

#[test]
fn header_and_table_disagreeing_is_refused() {
    let dir = copy_of_shipped();
    edit_manifest(dir.path(), |m| {
        let rows = m["rows"].as_u64().unwrap();
        m["rows"] = (rows - 1).into();
    });
    let err = Dictionary::load(dir.path()).unwrap_err();
    assert!(matches!(err, DictionaryError::Corrupt { .. }), "{err}");
}

#[test]
fn another_tokenizer_is_refused() {
    let dir = copy_of_shipped();
    edit_manifest(dir.path(), |m| {
        m["tokenizer"]["sha256"] = "00".repeat(32).into()
    });
    let err = Dictionary::load(dir.path()).unwrap_err();
    assert!(
        matches!(err, DictionaryError::TokenizerMismatch { .. }),
        "{err}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any token sequence (including ids past the vocabulary) derives without panic, the
    /// encoding round-trips, a second derivation gives the same bytes, and the embedding is a
    /// unit vector or all zeros, with an int8 quantisation that agrees with it.
    #[test]
    fn derivation_is_total_and_stable(
        ids in proptest::collection::vec(0u32..200_100, 0..300),
        name in proptest::option::of("[A-Za-zé ]{0,12}"),
    ) {
        let dict = common::dictionary();
        let tokenizer = Tokenizer::new();
        let tokens: Vec<TokenId> = ids.into_iter().map(TokenId).collect();
        let row = derive(dict, &tokenizer, name.as_deref(), &tokens);
        let bytes = row.encode();
        prop_assert_eq!(&RetrievalRow::decode(&bytes).unwrap(), &row);
        prop_assert_eq!(derive(dict, &tokenizer, name.as_deref(), &tokens).encode(), bytes);
        let name_tokens = name.as_deref().map_or(0, |n| tokenizer.encode(n).len());
        prop_assert_eq!(row.token_len as usize, tokens.len() + name_tokens);
        prop_assert_eq!(row.tokens.iter().map(|&(_, c)| c as usize).sum::<usize>(), row.token_len as usize);

        let mut stats = FrequencyTable::default();
        row.count_into(&mut stats);
        let e = embed(dict, &stats, &row);
        prop_assert_eq!(e.unit.len(), dict.dims());
        let norm: f32 = e.unit.iter().map(|x| x * x).sum::<f32>().sqrt();
        prop_assert!(norm == 0.0 || (norm - 1.0).abs() < 1e-4, "norm {}", norm);
        let q = e.quantize();
        for (x, v) in e.unit.iter().zip(&q.values) {
            prop_assert!((x - q.scale * f32::from(*v)).abs() <= q.scale * 0.5 + 1e-7);
        }
    }

    /// A retrieval row stored under the first encoding (every field fixed-width), as a store
    /// of an earlier release holds it, decodes to the same row as the current encoding's bytes.
    #[test]
    fn the_first_encoding_still_decodes(ids in proptest::collection::vec(0u32..200_100, 0..300)) {
        let dict = common::dictionary();
        let tokens: Vec<TokenId> = ids.into_iter().map(TokenId).collect();
        let row = derive(dict, &Tokenizer::new(), None, &tokens);
        let mut fixed = vec![1u8, row.dictionary_version.len() as u8];
        fixed.extend_from_slice(row.dictionary_version.as_bytes());
        fixed.extend_from_slice(&row.token_len.to_le_bytes());
        fixed.extend_from_slice(&(row.tokens.len() as u32).to_le_bytes());
        for &(token, count) in &row.tokens {
            fixed.extend_from_slice(&token.0.to_le_bytes());
            fixed.extend_from_slice(&count.to_le_bytes());
        }
        fixed.extend_from_slice(&(row.terms.len() as u32).to_le_bytes());
        for &(term, count) in &row.terms {
            fixed.extend_from_slice(&term.0.to_le_bytes());
            fixed.extend_from_slice(&count.to_le_bytes());
        }
        prop_assert_eq!(&RetrievalRow::decode(&fixed).unwrap(), &row);
        let current = row.encode();
        prop_assert!(current.len() <= fixed.len());
        for cut in 0..current.len() {
            prop_assert!(RetrievalRow::decode(&current[..cut]).is_err());
        }
    }

    /// Decoding arbitrary bytes never panics.
    #[test]
    fn decoding_garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = RetrievalRow::decode(&bytes);
    }
}
