use super::*;

const EPS: f64 = 1e-12;

#[test]
fn recall_counts_evidence_in_the_top_k() {
    let ranked = ["a", "b", "c", "d"];
    let evidence = ["c", "a", "z"];
    assert_eq!(recall_any(&ranked, &evidence, 1), 1.0);
    assert_eq!(recall_any(&ranked, &["d"], 3), 0.0);
    assert_eq!(recall_all(&ranked, &evidence, 4), 0.0, "z is never found");
    assert_eq!(recall_all(&ranked, &["c", "a"], 2), 0.0);
    assert_eq!(recall_all(&ranked, &["c", "a"], 3), 1.0);
    assert!((recall_frac(&ranked, &evidence, 1) - 1.0 / 3.0).abs() < EPS);
    assert!((recall_frac(&ranked, &evidence, 3) - 2.0 / 3.0).abs() < EPS);
    assert!(
        (recall_frac(&ranked, &evidence, 20) - 2.0 / 3.0).abs() < EPS,
        "k past the list"
    );
}

#[test]
fn ndcg_matches_hand_computation() {
    let ranked = ["a", "b", "c", "d"];
    // Evidence at ranks 2 and 4 (0-based 1 and 3): DCG = 1/log2(3) + 1/log2(5);
    // ideal: both first, 1 + 1/log2(3).
    let dcg = 1.0 / 3f64.log2() + 1.0 / 5f64.log2();
    let ideal = 1.0 + 1.0 / 3f64.log2();
    assert!((ndcg(&ranked, &["b", "d"], 4) - dcg / ideal).abs() < EPS);
    // At k = 2 only "b" counts, and the ideal holds both.
    assert!((ndcg(&ranked, &["b", "d"], 2) - (1.0 / 3f64.log2()) / ideal).abs() < EPS);
    // One evidence unit at rank 1 is perfect at any k; at rank 3, 1/log2(4) = 0.5.
    assert_eq!(ndcg(&ranked, &["a"], 1), 1.0);
    assert!((ndcg(&ranked, &["c"], 5) - 0.5).abs() < EPS);
    assert_eq!(ndcg(&ranked, &["z"], 4), 0.0);
}

#[test]
fn mrr_is_the_first_evidence_rank() {
    let ranked = [7, 3, 9];
    assert_eq!(mrr(&ranked, &[9, 3]), 0.5);
    assert_eq!(mrr(&ranked, &[7]), 1.0);
    assert!((mrr(&ranked, &[9]) - 1.0 / 3.0).abs() < EPS);
    assert_eq!(mrr(&ranked, &[4]), 0.0);
}

#[test]
fn question_metrics_follow_the_names() {
    let ks = [1, 3];
    let names = metric_names(&ks);
    assert_eq!(
        names,
        [
            "recall_any@1",
            "recall_all@1",
            "recall_frac@1",
            "ndcg@1",
            "recall_any@3",
            "recall_all@3",
            "recall_frac@3",
            "ndcg@3",
            "mrr"
        ]
    );
    let metrics = question_metrics(&["x", "e1", "e2"], &["e1", "e2"], &ks);
    let ideal = 1.0 + 1.0 / 3f64.log2();
    let dcg = 1.0 / 3f64.log2() + 0.5;
    let expected = [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, dcg / ideal, 0.5];
    assert_eq!(metrics.len(), names.len());
    for (got, want) in metrics.iter().zip(expected) {
        assert!((got - want).abs() < EPS, "{metrics:?}");
    }
}

#[test]
fn levels_average_and_serialize_in_order() {
    let ks = [2];
    let mut level = Level::new(&ks);
    assert_eq!(
        serde_json::to_string(&level).unwrap(),
        r#"{"questions":0,"recall_any@2":null,"recall_all@2":null,"recall_frac@2":null,"ndcg@2":null,"mrr":null}"#
    );
    level.add(&question_metrics(&["a", "b"], &["b"], &ks));
    level.add(&question_metrics(&["c", "d"], &["a", "c"], &ks));
    let means: Vec<Option<f64>> = level.means().map(|(_, m)| m).collect();
    let ndcg_b = 1.0 / 3f64.log2();
    let ndcg_c = 1.0 / (1.0 + 1.0 / 3f64.log2());
    let expected = [1.0, 0.5, 0.75, (ndcg_b + ndcg_c) / 2.0, 0.75];
    for (got, want) in means.iter().zip(expected) {
        assert!((got.unwrap() - want).abs() < EPS, "{means:?}");
    }
}

#[test]
fn units_keep_their_first_rank() {
    assert_eq!(first_occurrences([3, 1, 3, 2, 1]), [3, 1, 2]);
}

#[test]
fn jump_hash_matches_the_published_vectors() {
    for (key, buckets, bucket) in [
        (1, 1, 0),
        (42, 57, 43),
        (0xDEAD_10CC, 1, 0),
        (0xDEAD_10CC, 666, 361),
        (256, 1024, 520),
    ] {
        assert_eq!(jump_hash(key, buckets), bucket, "{key} over {buckets}");
    }
}

#[test]
fn a_user_stays_or_moves_to_the_new_shard() {
    for i in 0..200 {
        let key = format!("user-{i}");
        assert_eq!(shard_of(&key, 1), 0);
        for n in 1..16 {
            let (before, after) = (shard_of(&key, n), shard_of(&key, n + 1));
            assert!(before < n && (after == before || after == n), "{key} {n}");
        }
    }
}

#[test]
fn depths_are_sorted_and_checked() {
    assert_eq!(depths(&[10, 1, 10, 5]).unwrap(), [1, 5, 10]);
    assert!(matches!(depths(&[]), Err(EvalError::Depths { .. })));
    assert!(matches!(depths(&[0, 3]), Err(EvalError::Depths { .. })));
}
