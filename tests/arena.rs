//! The memory-mapped arena: a reopened arena maps what was committed and nothing else, a killed
//! append is cut back, damaged files are detected and rebuilt (never served), and a purge makes
//! the next open rebuild. Every case ends with integrity clean and the same search results as
//! an arena rebuilt in memory from the store.

mod common;

use std::path::{Path, PathBuf};

use perpetuity::arena::codebook::Codebook;
use perpetuity::arena::file::{
    Entry, PAGES_HEADER_BYTES, PAGES_OFFSET, PagesHeader, SKETCHES_OFFSET, TERMS_HEADER_BYTES,
    codebook_range, header_range, read_header, write_header,
};
use perpetuity::arena::{
    Arena, CODE_BYTES, Opened, PAGE_ROWS, Page, Sketch, Slot, Unusable, arena_dir, bfloat16,
    code_byte, page_checksum,
};
use perpetuity::ingest::ingest;
use perpetuity::integrity::{self, Report};
use perpetuity::measure::synthetic_messages;
use perpetuity::retrieve::{PreparedQuery, Retrieved, search};
use perpetuity::scan::kernels::{Ceiling, Kernels, code_offset};
use perpetuity::store::{Store, StoreOptions};
use perpetuity::types::{RowId, UserId};

const USERS: usize = 3;
const QUERIES: [&str; 3] = [
    "the kamiren talked about a new dorbel",
    "we went to the marfin next week",
    "my sa lo vi",
];

fn store_with_rows(dir: &Path, messages: usize) -> Store {
    let store = Store::open(dir, &StoreOptions::default()).unwrap();
    store
        .bind_dictionary(common::dictionary().version())
        .unwrap();
    ingest(
        &store,
        common::dictionary(),
        &synthetic_messages(messages, USERS, 7),
        |_, _| {},
    )
    .unwrap();
    store
}

fn user(i: usize) -> UserId {
    UserId::from_key(&format!("bench-user-{i}"))
}

/// Every query's top 10 for every user.
fn answers(arena: &Arena) -> Vec<Vec<Retrieved>> {
    let dict = common::dictionary();
    let kernels = Kernels::detect(Ceiling::Native);
    let mut all = Vec::new();
    for text in QUERIES {
        let query = PreparedQuery::new(dict, arena, text);
        for u in 0..USERS {
            all.push(search(dict, arena, &kernels, &[user(u)], &query, 10));
        }
    }
    all
}

/// The answers of an arena rebuilt in memory from the store: the reference.
fn reference(store: &Store) -> Vec<Vec<Retrieved>> {
    let mut arena = Arena::new();
    arena.catch_up(store, common::dictionary()).unwrap();
    answers(&arena)
}

/// Open the data directory's arena, catch it up, check integrity is clean and the answers are
/// the reference's; return how it was opened.
fn open_and_check(store: &Store, expected: &[Vec<Retrieved>]) -> Opened {
    let dict = common::dictionary();
    let (mut arena, opened) = Arena::open(store, dict).unwrap();
    arena.catch_up(store, dict).unwrap();
    let mut report = Report::default();
    integrity::check_arena(store, &arena, &mut report).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert_eq!(answers(&arena), expected, "answers after {opened:?}");
    opened
}

/// Open the data directory's arena, catch it up (committing it) and close it.
fn write_arena(store: &Store) {
    let dict = common::dictionary();
    let (mut arena, _) = Arena::open(store, dict).unwrap();
    arena.catch_up(store, dict).unwrap();
}

fn files(store: &Store) -> (PathBuf, PathBuf) {
    let dir = arena_dir(store.path(), common::dictionary().version()).unwrap();
    (dir.join("pages.bin"), dir.join("terms.bin"))
}

fn sketches_file(store: &Store) -> PathBuf {
    arena_dir(store.path(), common::dictionary().version())
        .unwrap()
        .join("sketches.bin")
}

fn header(pages: &[u8]) -> PagesHeader {
    read_header(pages).unwrap()
}

#[test]
fn a_reopened_arena_maps_what_was_committed() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_rows(dir.path(), 300);
    let dict = common::dictionary();

    let (mut arena, opened) = Arena::open(&store, dict).unwrap();
    assert_eq!(
        opened,
        Opened::Rebuilt {
            reason: Unusable::Missing
        }
    );
    assert_eq!(arena.catch_up(&store, dict).unwrap(), 300);
    drop(arena);

    let expected = reference(&store);
    assert_eq!(
        open_and_check(&store, &expected),
        Opened::Mapped { rows: 300 }
    );

    // Rows captured while no process held the arena are caught up on the next open, and
    // committed with it.
    ingest(&store, dict, &synthetic_messages(10, USERS, 8), |_, _| {}).unwrap();
    let expected = reference(&store);
    assert_eq!(
        open_and_check(&store, &expected),
        Opened::Mapped { rows: 300 }
    );
    assert_eq!(
        open_and_check(&store, &expected),
        Opened::Mapped { rows: 310 }
    );
    let mut report = Report::default();
    integrity::check_arena_files(&store, dict, &mut report).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
}

/// The pages `header` commits, in the bytes of `pages.bin`.
fn committed_pages<'b>(bytes: &'b mut [u8], header: &PagesHeader) -> &'b mut [Page] {
    bytemuck::cast_slice_mut(
        &mut bytes[PAGES_OFFSET..][..header.pages as usize * std::mem::size_of::<Page>()],
    )
}

/// The sketches of the pages `header` commits, in the bytes of `sketches.bin`.
fn committed_sketches<'b>(bytes: &'b mut [u8], header: &PagesHeader) -> &'b mut [Sketch] {
    bytemuck::cast_slice_mut(
        &mut bytes[SKETCHES_OFFSET..][..header.pages as usize * std::mem::size_of::<Sketch>()],
    )
}

/// A process killed while it recomputed the codebook leaves pages coded under a codebook the
/// header does not name: some re-encoded but not sealed yet, some sealed again. The next open
/// codes them again under the committed codebook and maps the arena, undamaged.
#[test]
fn a_codebook_recomputation_killed_before_its_commit_is_undone() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_rows(dir.path(), 300);
    write_arena(&store);
    let expected = reference(&store);
    let (pages_path, terms_path) = files(&store);
    let mut bytes = std::fs::read(&pages_path).unwrap();
    let committed = header(&bytes);
    assert!(committed.pages >= 2, "two pages to tear");
    let terms = std::fs::read(&terms_path).unwrap();
    let entries: &[Entry] = bytemuck::cast_slice(
        &terms[TERMS_HEADER_BYTES..][..committed.terms as usize * std::mem::size_of::<Entry>()],
    );
    let pages = committed_pages(&mut bytes, &committed);
    let sketches_path = sketches_file(&store);
    let mut sketch_bytes = std::fs::read(&sketches_path).unwrap();
    let sketches = committed_sketches(&mut sketch_bytes, &committed);
    // A codebook over the first page alone: not the committed one.
    let newer = Codebook::compute(&pages[..1]);
    assert_ne!(newer.checksum, committed.codebook_checksum);
    let before: Vec<Vec<u8>> = sketches.iter().map(|s| s.codes.to_vec()).collect();
    newer.encode_all(&mut pages[..2], &mut sketches[..2]);
    assert_ne!(sketches[0].codes.to_vec(), before[0], "page 0 coded anew");
    // Page 0 re-encoded only; page 1 re-encoded and sealed, as the commit's loop would.
    pages[1].sketch = sketches[1].checksum();
    pages[1].checksum = page_checksum(&pages[1], entries);
    std::fs::write(&pages_path, &bytes).unwrap();
    std::fs::write(&sketches_path, &sketch_bytes).unwrap();

    assert_eq!(
        open_and_check(&store, &expected),
        Opened::Mapped { rows: 300 }
    );
    // Opened as committed, and it stays so.
    assert_eq!(
        open_and_check(&store, &expected),
        Opened::Mapped { rows: 300 }
    );

    // A full page claiming more rows than a page holds, under a codebook the header does not
    // name: its count is cut back to its 64 committed rows and its codes made again, and it
    // reads as committed (found by the `arena` fuzz target: the check of a newer seal once read
    // past the page's 64 rows and panicked).
    let mut bytes = std::fs::read(&pages_path).unwrap();
    let pages = committed_pages(&mut bytes, &committed);
    assert_eq!(pages[0].rows as usize, PAGE_ROWS, "page 0 is full");
    pages[0].rows = 200;
    pages[0].codebook ^= 1;
    std::fs::write(&pages_path, &bytes).unwrap();
    assert_eq!(
        open_and_check(&store, &expected),
        Opened::Mapped { rows: 300 }
    );
}

/// The bytes of the arena's three files, in [`ArenaFiles::NAMES`] order.
fn read_files(store: &Store) -> [Vec<u8>; 3] {
    let (pages, terms) = files(store);
    [pages, sketches_file(store), terms].map(|path| std::fs::read(path).unwrap())
}

fn write_files(store: &Store, bytes: &[Vec<u8>; 3]) {
    let (pages, terms) = files(store);
    for (path, bytes) in [pages, sketches_file(store), terms].iter().zip(bytes) {
        std::fs::write(path, bytes).unwrap();
    }
}

/// What a kill left in the bytes of the three files, done to them.
type Kill<'a> = dyn Fn(&mut [Vec<u8>; 3]) + 'a;

/// What a process killed inside a commit that recomputed the codebook leaves, at the points
/// after the new codebook went to its slot: the header not written, or torn; a page's sketch
/// sum sealed but not its checksum; a page's codes half made again. Each opens the commit
/// before, undamaged, and catch-up brings it up to the store.
#[test]
fn a_commit_killed_after_its_codebook_opens_the_commit_before() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_rows(dir.path(), 40);
    let dict = common::dictionary();
    write_arena(&store);
    let before = read_files(&store);
    ingest(&store, dict, &synthetic_messages(130, USERS, 9), |_, _| {}).unwrap();
    write_arena(&store);
    let after = read_files(&store);
    let expected = reference(&store);
    let (old, new) = (header(&before[0]), header(&after[0]));
    assert_eq!((old.rows, new.rows), (40, 170));
    assert_eq!(new.commits, old.commits + 1);
    assert_ne!(
        new.codebook_slot, old.codebook_slot,
        "the recomputed codebook is written beside the committed one"
    );
    let slot = header_range((new.commits % 2) as usize);
    let old_book: Codebook =
        bytemuck::pod_read_unaligned(&before[0][codebook_range(old.codebook_slot as usize)]);
    // Killed before the header: its slot holds what it held before this commit.
    let unwritten = |files: &mut [Vec<u8>; 3]| {
        files[0][slot.clone()].copy_from_slice(&before[0][slot.clone()]);
    };
    // The pages as the last commit sealed them.
    let sealed = committed_pages(&mut before[0].clone(), &old).to_vec();
    let cases: Vec<(&str, Box<Kill>)> = vec![
        ("the header not written", Box::new(unwritten)),
        (
            "the header torn after its first 64 bytes",
            Box::new(|files| {
                let torn = slot.start + 64..slot.end;
                files[0][torn.clone()].copy_from_slice(&before[0][torn]);
            }),
        ),
        (
            "page 0 sealed with its sketch sum, its checksum not written",
            Box::new(|files| {
                unwritten(files);
                committed_pages(&mut files[0], &new)[0].checksum = sealed[0].checksum;
            }),
        ),
        (
            "page 1 marked with the new codebook and only its first row coded under it",
            Box::new(|files| {
                unwritten(files);
                // Neither seal written: the checksum and the sketch sum are the last commit's.
                let [pages, sketches, _] = files;
                let page = &mut committed_pages(pages, &new)[1];
                (page.checksum, page.sketch) = (sealed[1].checksum, sealed[1].sketch);
                let sketch = &mut committed_sketches(sketches, &new)[1];
                for i in 1..page.rows as usize {
                    sketch.set_code(i, &old_book.encode(page.vector(i), page.scales[i]));
                }
            }),
        ),
    ];
    for (what, kill) in &cases {
        let mut files = after.clone();
        kill(&mut files);
        write_files(&store, &files);
        assert_eq!(
            open_and_check(&store, &expected),
            Opened::Mapped { rows: 40 },
            "{what}"
        );
        assert_eq!(
            open_and_check(&store, &expected),
            Opened::Mapped { rows: 170 },
            "{what}"
        );
    }
}

#[test]
fn an_append_killed_before_its_commit_is_cut_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_rows(dir.path(), 200);
    write_arena(&store);
    let expected = reference(&store);

    // What a process killed in the middle of a catch-up leaves: a row written into a page
    // past its committed rows, a page allocated past the committed pages, term entries past
    // the committed ones; the header still the last commit's.
    let (pages_path, terms_path) = files(&store);
    let mut pages = std::fs::read(&pages_path).unwrap();
    let head = header(&pages);
    let size = std::mem::size_of::<Page>();
    let start = PAGES_OFFSET + (head.pages as usize - 1) * size;
    let last = start..start + size;
    let mut page: Page = bytemuck::pod_read_unaligned(&pages[last.clone()]);
    assert!((page.rows as usize) < perpetuity::arena::PAGE_ROWS);
    let i = page.rows as usize;
    page.row_ids[i] = head.watermark + 2;
    page.term_counts[i] = 3;
    page.term_offsets[i] = head.terms;
    page.vectors[i * 256] = 77;
    page.rows += 1;
    pages[last].copy_from_slice(bytemuck::bytes_of(&page));
    let next = PAGES_OFFSET + head.pages as usize * size;
    pages[next..next + size].fill(0xAB);
    std::fs::write(&pages_path, &pages).unwrap();
    // The row's sketch too, and a sketch past the committed ones.
    let sketches_path = sketches_file(&store);
    let mut sketches = std::fs::read(&sketches_path).unwrap();
    let sketch_size = std::mem::size_of::<Sketch>();
    let start = SKETCHES_OFFSET + (head.pages as usize - 1) * sketch_size;
    let last = start..start + sketch_size;
    let mut sketch: Sketch = bytemuck::pod_read_unaligned(&sketches[last.clone()]);
    if i == 0 {
        sketch.first_row = head.watermark + 2;
    }
    sketch.codes[code_offset(i, 0)] = 0x5A;
    sketch.alphas[i] = bfloat16(0.5);
    sketch.signatures[perpetuity::arena::blocked(i, 0)] |= 1 << 9;
    sketch.rows += 1;
    sketches[last].copy_from_slice(bytemuck::bytes_of(&sketch));
    let next = SKETCHES_OFFSET + head.pages as usize * sketch_size;
    sketches[next..next + sketch_size].fill(0xAB);
    std::fs::write(&sketches_path, &sketches).unwrap();
    let mut terms = std::fs::read(&terms_path).unwrap();
    let past = TERMS_HEADER_BYTES + head.terms as usize * 12;
    terms[past..past + 36].fill(0xCD);
    std::fs::write(&terms_path, &terms).unwrap();

    assert_eq!(
        open_and_check(&store, &expected),
        Opened::Mapped { rows: 200 }
    );
}

#[test]
fn damaged_files_are_detected_and_rebuilt_never_served() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_rows(dir.path(), 200);
    let dict = common::dictionary();
    write_arena(&store);
    let expected = reference(&store);
    let (pages_path, terms_path) = files(&store);
    let sketches_path = sketches_file(&store);
    let good = read_files(&store);
    let [good_pages, good_sketches, good_terms] = &good;
    let head = header(good_pages);
    let size = std::mem::size_of::<Page>();
    let pages_end = PAGES_OFFSET + head.pages as usize * size;
    assert_eq!(
        good_pages.len() % 4096,
        0,
        "the file is the mapping: grown, not cut"
    );
    let terms_end = TERMS_HEADER_BYTES + head.terms as usize * 12;
    let sketches_end = SKETCHES_OFFSET + head.pages as usize * std::mem::size_of::<Sketch>();
    let restore = || write_files(&store, &good);
    let flip = |path: &Path, good: &[u8], at: usize| {
        let mut bytes = good.to_vec();
        bytes[at] ^= 0x5A;
        std::fs::write(path, bytes).unwrap();
    };
    let damage = |opened: Opened| match opened {
        Opened::Rebuilt { reason } => assert!(reason.is_damage(), "{reason:?}"),
        Opened::Mapped { .. } => panic!("damage went unnoticed"),
    };

    // A byte of data every committed row depends on: always detected.
    let row0 = PAGES_OFFSET + std::mem::offset_of!(Page, vectors);
    let code0 = SKETCHES_OFFSET + std::mem::offset_of!(Sketch, codes);
    let code_last = code0 + code_offset(0, CODE_BYTES - 1);
    let alpha0 = SKETCHES_OFFSET + std::mem::offset_of!(Sketch, alphas);
    let signature0 = SKETCHES_OFFSET + std::mem::offset_of!(Sketch, signatures);
    let sketch_id0 = SKETCHES_OFFSET + std::mem::offset_of!(Sketch, first_row);
    let id0 = PAGES_OFFSET + std::mem::offset_of!(Page, row_ids);
    let last_row0 = row0 + (head.pages as usize - 1) * size;
    // The committed codebook: its mean, a bucket mean, its row count, its checksum.
    let book = codebook_range(head.codebook_slot as usize);
    let codebook = [
        book.start + 1,
        book.start + std::mem::offset_of!(Codebook, hi) + 17,
        book.start + std::mem::offset_of!(Codebook, rows),
        book.end - 1,
    ];
    for at in [id0, row0 + 5, last_row0 + 3].into_iter().chain(codebook) {
        flip(&pages_path, good_pages, at);
        damage(open_and_check(&store, &expected));
        restore();
    }
    // Both header slots: the magic, the row count. One slot alone reads as a commit cut short
    // (the other slot's counts, `a_commit_killed_after_its_codebook_opens_the_commit_before`).
    for at in [0, 40] {
        let mut bytes = good_pages.clone();
        bytes[at] ^= 0x5A;
        bytes[PAGES_HEADER_BYTES + at] ^= 0x5A;
        std::fs::write(&pages_path, bytes).unwrap();
        damage(open_and_check(&store, &expected));
        restore();
    }
    // The sketch of the first page: its codes, their scale, a signature word, its first row
    // id; and the first code byte of the last sketch.
    let last_code0 = code0 + (head.pages as usize - 1) * std::mem::size_of::<Sketch>();
    for at in [code0, code_last, alpha0, signature0, sketch_id0, last_code0] {
        flip(&sketches_path, good_sketches, at);
        damage(open_and_check(&store, &expected));
        restore();
    }
    for at in [0, TERMS_HEADER_BYTES, terms_end - 1] {
        flip(&terms_path, good_terms, at);
        let opened = open_and_check(&store, &expected);
        // The terms header's magic is checked by name; a term entry by its page's checksum.
        assert!(matches!(opened, Opened::Rebuilt { .. }), "{opened:?}");
        restore();
    }

    // Any committed byte: detected, or harmless (slots past a page's rows are zeroed when it is
    // opened), and the answers are always the reference's.
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let mut detected = 0;
    for round in 0..24 {
        let (path, good, committed) = match round % 3 {
            0 => (&terms_path, good_terms, terms_end),
            1 => (&sketches_path, good_sketches, sketches_end),
            _ => (&pages_path, good_pages, pages_end),
        };
        flip(path, good, next(committed));
        if let Opened::Rebuilt { reason } = open_and_check(&store, &expected) {
            assert!(reason.is_damage(), "{reason:?}");
            detected += 1;
        }
        restore();
    }
    println!("random flips detected: {detected} of 24");

    // A file cut short inside its committed part (the first page loses its vectors).
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&pages_path)
        .unwrap();
    file.set_len((PAGES_OFFSET + size / 3) as u64).unwrap();
    damage(open_and_check(&store, &expected));

    // Integrity reports damage it finds.
    flip(&pages_path, good_pages, row0);
    let mut report = Report::default();
    integrity::check_arena_files(&store, dict, &mut report).unwrap();
    let checks: Vec<&str> = report.violations.iter().map(|v| v.check).collect();
    assert_eq!(
        checks,
        ["arena files are usable"],
        "{:#?}",
        report.violations
    );
}

/// A sketch that disagrees with its row yet is sealed (its page's checksums made again over
/// it, as no crash or flip could): the arena opens, and integrity names each row it no longer
/// describes, and no other.
#[test]
fn integrity_checks_each_sketch_against_its_row() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_rows(dir.path(), 100);
    let dict = common::dictionary();
    write_arena(&store);
    let (pages_path, terms_path) = files(&store);
    let sketches_path = sketches_file(&store);
    let mut pages = std::fs::read(&pages_path).unwrap();
    let mut sketch_bytes = std::fs::read(&sketches_path).unwrap();
    let terms = std::fs::read(&terms_path).unwrap();
    let committed = header(&pages);
    let entries: &[Entry] = bytemuck::cast_slice(
        &terms[TERMS_HEADER_BYTES..][..committed.terms as usize * std::mem::size_of::<Entry>()],
    );
    let sketches = committed_sketches(&mut sketch_bytes, &committed);
    // Row 2's signature gains a bit, row 5's code a byte, row 7's term length one.
    sketches[0].signatures[perpetuity::arena::blocked(2, 1)] ^= 1 << 40;
    sketches[0].codes[code_offset(5, 3)] ^= 0x11;
    sketches[0].term_lens[7] += 1;
    let sketch = sketches[0];
    let page = &mut committed_pages(&mut pages, &committed)[0];
    page.sketch = sketch.checksum();
    page.checksum = page_checksum(page, entries);
    let ids = [2, 5, 7].map(|i| page.row_ids[i]);
    let user = page.user;
    std::fs::write(&pages_path, &pages).unwrap();
    std::fs::write(&sketches_path, &sketch_bytes).unwrap();

    let (mut arena, opened) = Arena::open(&store, dict).unwrap();
    assert_eq!(opened, Opened::Mapped { rows: 100 });
    arena.catch_up(&store, dict).unwrap();
    let mut report = Report::default();
    integrity::check_arena(&store, &arena, &mut report).unwrap();
    let named: Vec<(&str, String)> = report
        .violations
        .iter()
        .map(|v| (v.check, v.key.clone()))
        .collect();
    let expected: Vec<(&str, String)> = ids
        .iter()
        .map(|&id| {
            (
                "arena sketch holds the row's code, signature, id and length",
                format!("{user:016x}{id:016x}"),
            )
        })
        .collect();
    assert_eq!(named, expected, "{:#?}", report.violations);
}

/// Found by the arena fuzz target (`fuzz/`): a header, checksum intact, claiming so many pages
/// or term entries that their length overflowed, panicked in `Arena::open`. It is a file too
/// short for its header, rebuilt.
#[test]
fn a_header_claiming_more_than_any_file_holds_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_rows(dir.path(), 100);
    write_arena(&store);
    let expected = reference(&store);
    let (pages_path, _) = files(&store);
    let good = std::fs::read(&pages_path).unwrap();
    for short in ["pages.bin", "terms.bin"] {
        let mut head = header(&good);
        match short {
            "pages.bin" => head.pages = 0x0400_0000_0000_0009,
            _ => head.terms = u64::MAX,
        }
        head.checksum = head.compute_checksum();
        let mut bytes = good.clone();
        write_header(&mut bytes, &head);
        std::fs::write(&pages_path, bytes).unwrap();
        let opened = open_and_check(&store, &expected);
        assert!(
            matches!(&opened, Opened::Rebuilt { reason: Unusable::Truncated { file, .. } } if *file == short),
            "{opened:?}"
        );
    }
}

/// A page with a valid checksum whose rows' entries lie past the entries the header commits (a
/// crafted file: no crash leaves one), with rows cut from it so that the open seals it again:
/// the open reports the damage and rebuilds, and panics nowhere, since every kept row's entries
/// are checked against the committed count before anything reads them. Both ways: a header
/// committing no entries and one row of the page; the page's first entry count raised within
/// the written entries (past the committed ones) and the page sealed again over them.
#[test]
fn a_sealed_page_whose_entries_lie_past_the_committed_ones_is_rebuilt_without_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_rows(dir.path(), 100);
    write_arena(&store);
    let expected = reference(&store);
    let good = read_files(&store);
    let head = header(&good[0]);
    let written: &[Entry] = bytemuck::cast_slice(
        &good[2][TERMS_HEADER_BYTES..][..(good[2].len() - TERMS_HEADER_BYTES) / 12 * 12],
    );
    let first_page = PAGES_OFFSET..PAGES_OFFSET + std::mem::size_of::<Page>();
    let first: Page = bytemuck::pod_read_unaligned(&good[0][first_page.clone()]);
    assert!(first.rows >= 2);
    assert_eq!(first.checksum, page_checksum(&first, written), "sealed");
    // Committed: the page's first row, `terms` entries.
    let cut = |terms: u64| {
        let mut cut = head;
        cut.watermark = first.row_ids[1];
        cut.terms = terms;
        cut.checksum = cut.compute_checksum();
        cut
    };
    let raised = {
        let mut page = first;
        page.term_counts[0] += u32::try_from(head.terms).unwrap();
        let end = page.term_offsets[0] + page.entries_of(0) as u64;
        assert!(end > head.terms && end <= written.len() as u64);
        page.checksum = page_checksum(&page, written);
        page
    };
    for (header, page) in [(cut(0), first), (cut(head.terms), raised)] {
        let mut files = good.clone();
        write_header(&mut files[0], &header);
        files[0][first_page.clone()].copy_from_slice(bytemuck::bytes_of(&page));
        write_files(&store, &files);
        let opened = open_and_check(&store, &expected);
        assert_eq!(
            opened,
            Opened::Rebuilt {
                reason: Unusable::Page {
                    page: 0,
                    what: "terms past the committed entries"
                }
            }
        );
    }
}

#[test]
fn a_purge_makes_the_next_open_rebuild_without_reporting_damage() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_rows(dir.path(), 150);
    let dict = common::dictionary();
    write_arena(&store);
    store.purge_user(user(1)).unwrap();
    let expected = reference(&store);
    assert!(expected[1].is_empty() && !expected[0].is_empty());
    assert_eq!(
        open_and_check(&store, &expected),
        Opened::Rebuilt {
            reason: Unusable::Purged
        }
    );
    let mut report = Report::default();
    integrity::check_arena_files(&store, dict, &mut report).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
}

/// A purge takes the user's rows out of the arena where they lie: the other users' answers
/// are a fresh arena's, integrity is clean, no byte of the purged rows' terms stays in the
/// files, and the next open maps the arena as it is (no rebuild); rows captured after it are
/// placed in new pages, never in an emptied one.
#[test]
fn a_purge_empties_the_users_pages_in_place_and_the_arena_maps_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_rows(dir.path(), 150);
    let dict = common::dictionary();
    let (mut arena, _) = Arena::open(&store, dict).unwrap();
    arena.catch_up(&store, dict).unwrap();
    let pages_before = arena.page_count();
    let purged: Vec<(u32, usize)> = (0..arena.page_count() as u32)
        .filter(|&p| arena.page(p).user == user(1).0)
        .map(|p| (p, arena.page(p).rows as usize))
        .collect();
    assert!(!purged.is_empty());
    let entries: Vec<(u64, usize)> = purged
        .iter()
        .flat_map(|&(p, rows)| {
            let page = *arena.page(p);
            (0..rows).map(move |i| (page.term_offsets[i], page.entries_of(i)))
        })
        .collect();
    let held = arena.rows();
    let removed = store.remove_user(user(1)).unwrap();
    let taken = arena.purge_users(&[user(1)], &store, dict).unwrap();
    assert_eq!(taken, removed);
    assert_eq!(arena.rows(), held - removed as usize);
    assert_eq!(arena.scope_rows(&[user(1)]), 0);
    assert_eq!(arena.page_count(), pages_before, "no page moved or rebuilt");
    for &(p, _) in &purged {
        let page = arena.page(p);
        assert_eq!((page.user, page.rows), (0, 0));
        assert!(page.vectors.iter().all(|&v| v == 0));
    }
    let expected = reference(&store);
    assert!(expected[1].is_empty() && !expected[0].is_empty());
    assert_eq!(answers(&arena), expected);
    let mut report = Report::default();
    integrity::check_arena(&store, &arena, &mut report).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
    drop(arena);
    let terms = std::fs::read(files(&store).1).unwrap();
    for (offset, len) in entries {
        let entry = std::mem::size_of::<Entry>();
        let start = TERMS_HEADER_BYTES + offset as usize * entry;
        assert!(
            terms[start..start + len * entry].iter().all(|&b| b == 0),
            "a purged row's terms stayed in terms.bin"
        );
    }
    assert_eq!(
        open_and_check(&store, &expected),
        Opened::Mapped {
            rows: (held - removed as usize) as u64
        }
    );
    store.finish_purge(user(1)).unwrap();
    let mut report = Report::default();
    integrity::check_arena_files(&store, dict, &mut report).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
}

#[test]
fn a_catch_up_longer_than_one_batch_commits_batch_by_batch() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_rows(dir.path(), 70_000);
    let dict = common::dictionary();
    let (mut arena, _) = Arena::open(&store, dict).unwrap();
    assert_eq!(arena.catch_up(&store, dict).unwrap(), 70_000);
    assert_eq!(arena.watermark(), store.next_row());
    drop(arena);
    let expected = reference(&store);
    assert_eq!(
        open_and_check(&store, &expected),
        Opened::Mapped { rows: 70_000 }
    );
}

/// The codebook is computed when the arena first holds rows and again whenever the rows reach
/// four times the count it was computed over; every row's code is then its encoding under the
/// current codebook, a reopened arena maps the same codebook and codes, and integrity stays
/// clean.
#[test]
fn the_codebook_follows_the_rows_and_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_rows(dir.path(), 40);
    let dict = common::dictionary();
    let (mut arena, _) = Arena::open(&store, dict).unwrap();
    arena.catch_up(&store, dict).unwrap();
    assert_eq!(arena.codebook().rows, 40);
    let first = *arena.codebook();

    // 40 → 150 rows: below 4 × 40, rows are coded with the codebook of 40.
    ingest(&store, dict, &synthetic_messages(110, USERS, 9), |_, _| {}).unwrap();
    arena.catch_up(&store, dict).unwrap();
    assert_eq!(arena.rows(), 150);
    assert_eq!(*arena.codebook(), first);
    assert_codes_are_encodings(&arena);

    // 150 → 170 rows reaches 4 × 40: computed again over all 170, every row re-encoded.
    ingest(&store, dict, &synthetic_messages(20, USERS, 10), |_, _| {}).unwrap();
    arena.catch_up(&store, dict).unwrap();
    assert_eq!(arena.codebook().rows, 170);
    assert_ne!(*arena.codebook(), first);
    assert_codes_are_encodings(&arena);
    let (codebook, codes) = (*arena.codebook(), codes_of(&arena));
    drop(arena);

    let (mut reopened, opened) = Arena::open(&store, dict).unwrap();
    assert_eq!(opened, Opened::Mapped { rows: 170 });
    assert_eq!(*reopened.codebook(), codebook);
    assert_eq!(codes_of(&reopened), codes);
    reopened.catch_up(&store, dict).unwrap();
    let mut report = Report::default();
    integrity::check_arena(&store, &reopened, &mut report).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
}

/// Every row's code bytes and scale α, in page order.
fn codes_of(arena: &Arena) -> Vec<(Vec<u8>, f32)> {
    let sketches = arena
        .scope_sketches(&(0..USERS).map(user).collect::<Vec<_>>())
        .sketches;
    sketches
        .iter()
        .flat_map(|sketch| {
            (0..sketch.rows as usize).map(|i| (sketch.code_bytes(i).to_vec(), sketch.alpha(i)))
        })
        .collect()
}

fn assert_codes_are_encodings(arena: &Arena) {
    let scope: Vec<UserId> = (0..USERS).map(user).collect();
    for (page, sketch) in arena
        .scope_pages(&scope)
        .into_iter()
        .zip(arena.scope_sketches(&scope).sketches)
    {
        assert_eq!(sketch.rows, page.rows);
        for i in 0..page.rows as usize {
            let code = arena.codebook().encode(page.vector(i), page.scales[i]);
            let bytes: Vec<u8> = (0..CODE_BYTES)
                .map(|b| code_byte(&code.signs, &code.magnitudes, b))
                .collect();
            assert_eq!(sketch.code_bytes(i).to_vec(), bytes);
            assert_eq!(sketch.alphas[i], bfloat16(code.alpha));
        }
    }
}

/// A slot's key names it (`Slot::from_key` inverts `Slot::key`) and orders as the arena lays
/// rows out: within one user, as their row ids, which is how stage one's ties and the order
/// stage two reads its candidates in stay those of the row ids.
#[test]
fn slot_keys_name_their_slots_and_order_a_users_rows_by_id() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_rows(dir.path(), 600);
    let mut arena = Arena::new();
    arena.catch_up(&store, common::dictionary()).unwrap();
    for u in 0..USERS {
        let mut rows: Vec<(u64, RowId)> = Vec::new();
        for p in arena.scope_page_numbers(&[user(u)]) {
            let page = arena.page(p);
            for index in 0..page.rows {
                let slot = Slot { page: p, index };
                assert_eq!(Slot::from_key(slot.key()), slot);
                let id = RowId(page.row_ids[index as usize]);
                assert_eq!(arena.slot(id), Some(slot));
                rows.push((slot.key(), id));
            }
        }
        assert!(rows.len() > 2 * PAGE_ROWS, "{} rows", rows.len());
        rows.sort_unstable();
        assert!(rows.windows(2).all(|w| w[0].1 < w[1].1), "user {u}");
    }
}
