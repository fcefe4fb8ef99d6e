//! The fuzz targets' bodies: each takes libFuzzer's bytes, hands them to one of Perpetuity's
//! parsers and asserts what that parser promises, whatever the bytes (no panic; typed errors;
//! round trips where there is an inverse). `fuzz_targets/` holds one three-line binary per
//! target; `docs/reliability.md` lists what each asserts.

use std::path::Path;
use std::sync::OnceLock;

use perpetuity::arena::codebook::Codebook;
use perpetuity::arena::file::{
    Entry, MappedFile, PAGES_OFFSET, PagesHeader, SKETCHES_OFFSET, SLOTS, TERMS_HEADER_BYTES,
    codebook_range, header_range, read_header,
};
use perpetuity::arena::{
    Arena, ArenaFiles, PAGE_ROWS, Page, Side, Sketch, arena_dir, page_checksum,
};
use perpetuity::config::default_dictionaries_root;
use perpetuity::dictionary::format::Table;
use perpetuity::dictionary::{
    DEFAULT_VERSION, Dictionary, DictionaryError, MANIFEST_FORMAT_VERSION, Manifest,
};
use perpetuity::frame::{Frame, Message, Omitted, Side as Speaker};
use perpetuity::ingest::ingest;
use perpetuity::measure::synthetic_messages;
use perpetuity::proxy::rounds::Splice;
use perpetuity::proxy::sse::{self, StreamReader};
use perpetuity::proxy::wire::{self, Format};
use perpetuity::retrieve::{PreparedQuery, search};
use perpetuity::scan::kernels::{Ceiling, Kernels};
use perpetuity::store::{Store, StoreOptions};
use perpetuity::types::{RowId, UserId};
use serde_json::Value;

/// A chat request body in `format`: it parses or is refused with a message, never panics; a
/// parsed request's live question is one of its messages; and the body the proxy sends
/// upstream (the frame in place of the conversation) parses again in the same format, with the
/// same model, a live question that opens with the frame's (its attachments' placeholders
/// follow it again) and the same newness.
pub fn request(format: Format, data: &[u8]) {
    let path_model = (format == Format::Gemini).then_some("gemini-2.5-flash");
    let Ok(request) = wire::parse(format, data, path_model) else {
        return;
    };
    assert!(!request.model.is_empty());
    assert_eq!(request.question.is_some(), request.question_at.is_some());
    let Some(question) = &request.question else {
        return;
    };
    assert!(
        request
            .question_at
            .is_some_and(|at| at < request.messages.len())
    );
    let said = |role, content: &str| Message {
        role,
        content: content.to_owned(),
        rows: vec![RowId(1)],
        partial: Vec::new(),
        tokens: 1,
    };
    let frame = Frame {
        messages: vec![
            said(Speaker::User, "an earlier question"),
            said(Speaker::Assistant, "its answer"),
            said(Speaker::User, question),
        ],
        tokens: 3,
        cap: 100,
        rows: vec![RowId(1)],
        mandatory: 1,
        omitted: Omitted::default(),
    };
    // The history either held whole by the memory (the frame replaces it) or held by none of it
    // (every item is forwarded where it stood, before the frame).
    let at = request.question_at.unwrap_or(request.messages.len());
    let unheld: Vec<usize> = (0..at).collect();
    for context in [&[][..], &unheld[..]] {
        let framed = wire::framed(&request, &wire::frame_items(format, &frame), context);
        let sent = wire::encode(
            &request,
            &framed.body,
            Some(&framed.verbatim),
            &[format.list()],
        );
        let again = wire::parse(format, &sent, path_model).expect("the framed body parses again");
        assert_eq!(again.model, request.model);
        // The frame's text takes the words' place; the turn's attachments stay beside it, so
        // they are read again after it.
        assert!(
            again
                .question
                .as_deref()
                .is_some_and(|again| again.starts_with(question.as_str())),
            "{:?} then {question:?}",
            again.question
        );
        assert_eq!(again.question_is_new(), request.question_is_new());
        assert_eq!(again.server_history, request.server_history);
    }
}

const FORMATS: [Format; 4] = [
    Format::Chat,
    Format::Responses,
    Format::Messages,
    Format::Gemini,
];

/// An upstream SSE stream: byte 0 picks the format, byte 1 where the stream is cut in two
/// chunks, the rest is the stream. The decoder reads the same text whatever the chunking; the
/// splice relays the same events whatever the chunking, each one whole event; and every event
/// whose data is a JSON object re-encodes to one event whose data decodes to the same object.
pub fn sse(data: &[u8]) {
    let [selector, cut, stream @ ..] = data else {
        return;
    };
    let format = FORMATS[usize::from(*selector) % FORMATS.len()];
    let chunks = stream.split_at(stream.len() * usize::from(*cut) / usize::from(u8::MAX));
    let chunks = [chunks.0, chunks.1];

    assert_eq!(read(format, &chunks), read(format, &[stream]));
    let relayed = relay(format, &[stream]);
    assert_eq!(relay(format, &chunks), relayed);
    for event in &relayed {
        assert_one_event(event);
    }

    let mut rest = stream;
    while let Some((end, gap)) = sse::event_end(rest) {
        let decoded = serde_json::from_str::<Value>(&sse::event_data(&rest[..end]));
        if let Ok(Value::Object(object)) = decoded {
            let encoded = sse::encode_event(format, &object);
            assert_one_event(&encoded);
            let again: Value = serde_json::from_str(&sse::event_data(&encoded))
                .expect("an encoded event's data is JSON");
            assert_eq!(again, Value::Object(object));
        }
        rest = &rest[end + gap..];
    }
}

/// What [`StreamReader`] makes of `chunks`: the text, whether complete, whether terminated.
fn read(format: Format, chunks: &[&[u8]]) -> (String, bool, bool) {
    let mut reader = StreamReader::new(format, usize::MAX);
    for chunk in chunks {
        reader.feed(chunk);
    }
    let terminated = reader.terminated();
    let (text, complete) = reader.finish();
    (text, complete, terminated)
}

/// The events one round of the splice relays from `chunks`.
fn relay(format: Format, chunks: &[&[u8]]) -> Vec<Vec<u8>> {
    let mut splice = Splice::new(format, usize::MAX);
    let mut out: Vec<Vec<u8>> = chunks
        .iter()
        .flat_map(|c| splice.feed(c).expect("no event is over an unbounded limit"))
        .collect();
    out.extend(splice.flush());
    out
}

/// `bytes` are exactly one SSE event, its blank line included.
fn assert_one_event(bytes: &[u8]) {
    let (end, gap) = sse::event_end(bytes).expect("an event ends with a blank line");
    assert_eq!(
        end + gap,
        bytes.len(),
        "one event, then nothing: {:?}",
        String::from_utf8_lossy(bytes)
    );
}

/// `vectors.bin` bytes: a typed error, or a table whose columns hold what the header says and
/// that serialises back to exactly these bytes.
pub fn dictionary_table(data: &[u8]) {
    match Table::parse(Path::new("vectors.bin"), data) {
        Ok(table) => {
            let rows = table.header.rows as usize;
            assert_eq!(table.token_ids.len(), rows);
            assert_eq!(table.scales.len(), rows);
            assert_eq!(table.values.len(), rows * table.header.dims as usize);
            assert!(table.token_ids.windows(2).all(|w| w[0] < w[1]));
            assert!(table.scales.iter().all(|s| s.is_finite() && *s >= 0.0));
            assert_eq!(table.to_bytes(), data);
        }
        Err(err) => assert!(
            matches!(
                err,
                DictionaryError::Truncated { .. }
                    | DictionaryError::Corrupt { .. }
                    | DictionaryError::UnsupportedFormatVersion { .. }
            ),
            "{err}"
        ),
    }
}

/// `dictionary.json` bytes: a typed error, or a manifest of this build's format version that
/// serialises to JSON which parses back to the same manifest.
pub fn dictionary_manifest(data: &[u8]) {
    let path = Path::new("dictionary.json");
    match Manifest::parse(path, data) {
        Ok(manifest) => {
            assert_eq!(manifest.format_version, MANIFEST_FORMAT_VERSION);
            let json = serde_json::to_vec(&manifest).expect("a manifest serialises");
            let again = Manifest::parse(path, &json).expect("a serialised manifest parses");
            assert_eq!(again, manifest);
        }
        Err(err) => assert!(
            matches!(
                err,
                DictionaryError::Manifest { .. } | DictionaryError::UnsupportedFormatVersion { .. }
            ),
            "{err}"
        ),
    }
}

/// A real arena, written once per process: its files (their lengths, and their bytes up to the
/// zeros that end them) and what opening them checks against.
struct Base {
    dictionary: Dictionary,
    kernels: Kernels,
    files: [(usize, Vec<u8>); 3],
    header: PagesHeader,
}

/// Write the real arena [`arena`] starts from (once per process; the target's `init`).
pub fn arena_init() {
    base();
}

fn base() -> &'static Base {
    static BASE: OnceLock<Base> = OnceLock::new();
    BASE.get_or_init(|| {
        let dictionary = Dictionary::load_version(&default_dictionaries_root(), DEFAULT_VERSION)
            .expect("the shipped dictionary loads");
        let dir = std::env::temp_dir().join(format!("perpetuity-fuzz-{}", std::process::id()));
        let files = {
            let store = Store::open(&dir, &StoreOptions::default()).expect("a store opens");
            store
                .bind_dictionary(dictionary.version())
                .expect("the store binds the dictionary");
            ingest(
                &store,
                &dictionary,
                &synthetic_messages(300, 3, 7),
                |_, _| {},
            )
            .expect("the messages are stored");
            let (mut arena, _) = Arena::open(&store, &dictionary).expect("the arena opens");
            arena
                .catch_up(&store, &dictionary)
                .expect("the arena catches up");
            let arena_files = arena_dir(store.path(), dictionary.version())
                .expect("the shipped version names a folder");
            let read = |name| {
                let mut bytes = std::fs::read(arena_files.join(name)).expect("an arena file reads");
                let len = bytes.len();
                let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |at| at + 1);
                bytes.truncate(end);
                (len, bytes)
            };
            ArenaFiles::NAMES.map(read)
        };
        std::fs::remove_dir_all(&dir).expect("the scratch store is removed");
        let header = read_header(&files[0].1).expect("the written arena has a header");
        Base {
            dictionary,
            kernels: Kernels::detect(Ceiling::Native),
            files,
            header,
        }
    })
}

/// Seal again every page the header counts, as a commit does: its sketch's sum, then its
/// checksum over its rows' entries among those written in `terms.bin`. A page whose rows'
/// entries do not all lie in the file is left as it is (sealing would read past the file).
fn seal_pages(files: &mut [MappedFile; 3]) {
    let Ok(header) = read_header(files[0].bytes()) else {
        return;
    };
    let [pages, sketches, terms] = files;
    let entry_bytes = std::mem::size_of::<Entry>();
    let written = (terms.bytes().len() - TERMS_HEADER_BYTES) / entry_bytes;
    let entries: &[Entry] =
        bytemuck::cast_slice(&terms.bytes()[TERMS_HEADER_BYTES..][..written * entry_bytes]);
    let (page_bytes, sketch_bytes) = (std::mem::size_of::<Page>(), std::mem::size_of::<Sketch>());
    let count = usize::try_from(header.pages)
        .unwrap_or(usize::MAX)
        .min((pages.bytes().len() - PAGES_OFFSET) / page_bytes)
        .min((sketches.bytes().len() - SKETCHES_OFFSET) / sketch_bytes);
    for p in 0..count {
        let at = PAGES_OFFSET + p * page_bytes;
        let mut page: Page = bytemuck::pod_read_unaligned(&pages.bytes()[at..at + page_bytes]);
        let sketch: Sketch = bytemuck::pod_read_unaligned(
            &sketches.bytes()[SKETCHES_OFFSET + p * sketch_bytes..][..sketch_bytes],
        );
        let rows = page.rows as usize;
        let inside = rows <= PAGE_ROWS
            && (0..rows).all(|i| {
                page.term_offsets[i].saturating_add(page.entries_of(i) as u64) <= written as u64
            });
        if inside {
            page.sketch = sketch.checksum();
            page.checksum = page_checksum(&page, entries);
            pages.bytes_mut()[at..at + page_bytes].copy_from_slice(bytemuck::bytes_of(&page));
        }
    }
}

/// A real arena's three files with the input's changes: byte 0's low bit says whether to seal
/// the header and codebook checksums again afterwards, its next bit whether to seal every page
/// again ([`seal_pages`]), so the checks behind the checksums are reached; then records of five bytes `[what,
/// offset (3 bytes, little-endian), length]` and `length` bytes to write there (`what`: bit 1
/// cuts the file at the offset instead, zeroing the rest as a short file reads; the other bits,
/// modulo 3, pick the file: `pages.bin`, `sketches.bin`, `terms.bin`). The reader answers an arena or a typed reason, never panics; an arena
/// it accepts answers every read (slots, entries, neighbours, a search) without panicking, each
/// row's slot holds that row, and a row's neighbours are its own user's.
pub fn arena(data: &[u8]) {
    let base = base();
    let Some((flags, mut records)) = data.split_first() else {
        return;
    };
    let mut files = base.files.each_ref().map(|(len, bytes)| {
        let mut file = MappedFile::anonymous(*len).expect("anonymous memory maps");
        file.bytes_mut()[..bytes.len()].copy_from_slice(bytes);
        file
    });
    while let [what, a, b, c, len, rest @ ..] = records {
        let bytes = files[usize::from(what & !2) % 3].bytes_mut();
        let at = u32::from_le_bytes([*a, *b, *c, 0]) as usize % bytes.len();
        if what & 2 != 0 {
            bytes[at..].fill(0);
            records = rest;
            continue;
        }
        let n = usize::from(*len).min(rest.len()).min(bytes.len() - at);
        bytes[at..at + n].copy_from_slice(&rest[..n]);
        records = &rest[n..];
    }
    if flags & 1 != 0 {
        let bytes = files[0].bytes_mut();
        let slot = header_range((base.header.commits % SLOTS as u64) as usize);
        let mut header: PagesHeader = bytemuck::pod_read_unaligned(&bytes[slot.clone()]);
        let book = codebook_range(header.codebook_slot as usize % SLOTS);
        let mut codebook: Codebook = bytemuck::pod_read_unaligned(&bytes[book.clone()]);
        codebook.checksum = codebook.compute_checksum();
        header.codebook_checksum = codebook.checksum;
        header.checksum = header.compute_checksum();
        bytes[slot].copy_from_slice(bytemuck::bytes_of(&header));
        bytes[book].copy_from_slice(bytemuck::bytes_of(&codebook));
    }
    if flags & 2 != 0 {
        seal_pages(&mut files);
    }
    let [pages, sketches, terms] = files;
    let header = &base.header;
    let Ok(arena) = Arena::map_existing(
        ArenaFiles {
            pages,
            sketches,
            terms,
        },
        header.dictionary,
        header.purges,
        RowId(header.watermark),
    ) else {
        return;
    };
    let mut users = Vec::new();
    for id in 0..arena.watermark().0 {
        let Some(slot) = arena.slot(RowId(id)) else {
            continue;
        };
        let page = arena.page(slot.page);
        assert_eq!(page.row_ids[slot.index as usize], id);
        let sketch = arena.sketch(slot.page);
        assert_eq!(sketch.rows, page.rows);
        assert_eq!(sketch.first_row, page.row_ids[0]);
        users.push(UserId(page.user));
        let entries = arena.row_entries(slot);
        assert!(entries.token_counts().count() <= page.entries_of(slot.index as usize));
        for side in [Side::Before, Side::After] {
            if let Some(next) = arena.neighbour(slot, side) {
                assert_eq!(arena.page(next.page).user, page.user);
            }
        }
    }
    users.sort_unstable();
    users.dedup();
    let query = PreparedQuery::new(
        &base.dictionary,
        &arena,
        "the kamiren talked about a dorbel",
    );
    search(&base.dictionary, &arena, &base.kernels, &users, &query, 10);
}
