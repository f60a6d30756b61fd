;; Passes over a vocabulary's logits with 128-bit SIMD, for the sampler (logit_scan.ts).
;; The logits live in this module's memory at byte offset 0; callers pass pointers into it.
;; Rebuild logit_scan.ts from this file with `deno task wasm` (a test checks that they agree).
(module
  (memory (export "memory") 1)

  ;; above(p, n, t, out, max): writes the indexes i (ascending) with x[i] >= t to out as i32 and
  ;; returns how many, or -1 as soon as there are more than max. NaN is never >= t.
  (func (export "above")
    (param $p i32) (param $n i32) (param $t f32) (param $out i32) (param $max i32) (result i32)
    (local $i i32) (local $end i32) (local $tv v128) (local $count i32) (local $j i32) (local $a i32)
    (local.set $tv (f32x4.splat (local.get $t)))
    (local.set $end (i32.and (local.get $n) (i32.const -16)))
    ;; 16 values a round: one test for all of them, a scalar look only where one passed.
    (block $done
      (loop $round
        (br_if $done (i32.ge_u (local.get $i) (local.get $end)))
        (local.set $a (i32.add (local.get $p) (i32.shl (local.get $i) (i32.const 2))))
        (if (v128.any_true
              (v128.or
                (v128.or (f32x4.ge (v128.load (local.get $a)) (local.get $tv))
                         (f32x4.ge (v128.load offset=16 (local.get $a)) (local.get $tv)))
                (v128.or (f32x4.ge (v128.load offset=32 (local.get $a)) (local.get $tv))
                         (f32x4.ge (v128.load offset=48 (local.get $a)) (local.get $tv)))))
          (then
            (local.set $j (i32.const 0))
            (loop $each
              (if (f32.ge (f32.load (i32.add (local.get $a) (i32.shl (local.get $j) (i32.const 2))))
                          (local.get $t))
                (then
                  (if (i32.ge_u (local.get $count) (local.get $max)) (then (return (i32.const -1))))
                  (i32.store (i32.add (local.get $out) (i32.shl (local.get $count) (i32.const 2)))
                             (i32.add (local.get $i) (local.get $j)))
                  (local.set $count (i32.add (local.get $count) (i32.const 1)))))
              (local.set $j (i32.add (local.get $j) (i32.const 1)))
              (br_if $each (i32.lt_u (local.get $j) (i32.const 16))))))
        (local.set $i (i32.add (local.get $i) (i32.const 16)))
        (br $round)))
    ;; The last n % 16 values.
    (block $tail_done
      (loop $tail
        (br_if $tail_done (i32.ge_u (local.get $i) (local.get $n)))
        (if (f32.ge (f32.load (i32.add (local.get $p) (i32.shl (local.get $i) (i32.const 2))))
                    (local.get $t))
          (then
            (if (i32.ge_u (local.get $count) (local.get $max)) (then (return (i32.const -1))))
            (i32.store (i32.add (local.get $out) (i32.shl (local.get $count) (i32.const 2))) (local.get $i))
            (local.set $count (i32.add (local.get $count) (i32.const 1)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $tail)))
    (local.get $count))

  ;; max(p, n): the largest of x[0..n), NaN ignored; -Infinity when n is 0 or all are NaN.
  (func (export "max") (param $p i32) (param $n i32) (result f32)
    (local $i i32) (local $end i32) (local $a i32) (local $best f32) (local $v f32)
    (local $m0 v128) (local $m1 v128) (local $m2 v128) (local $m3 v128)
    (local.set $m0 (f32x4.splat (f32.const -inf)))
    (local.set $m1 (local.get $m0))
    (local.set $m2 (local.get $m0))
    (local.set $m3 (local.get $m0))
    (local.set $end (i32.and (local.get $n) (i32.const -16)))
    ;; Four independent maxima (16 values a round): one chain would wait on each max's latency.
    ;; pmax(m, v) = m < v ? v : m: a NaN in v never replaces m.
    (block $done
      (loop $round
        (br_if $done (i32.ge_u (local.get $i) (local.get $end)))
        (local.set $a (i32.add (local.get $p) (i32.shl (local.get $i) (i32.const 2))))
        (local.set $m0 (f32x4.pmax (local.get $m0) (v128.load (local.get $a))))
        (local.set $m1 (f32x4.pmax (local.get $m1) (v128.load offset=16 (local.get $a))))
        (local.set $m2 (f32x4.pmax (local.get $m2) (v128.load offset=32 (local.get $a))))
        (local.set $m3 (f32x4.pmax (local.get $m3) (v128.load offset=48 (local.get $a))))
        (local.set $i (i32.add (local.get $i) (i32.const 16)))
        (br $round)))
    (local.set $m0 (f32x4.pmax (f32x4.pmax (local.get $m0) (local.get $m1))
                               (f32x4.pmax (local.get $m2) (local.get $m3))))
    (local.set $best (f32x4.extract_lane 0 (local.get $m0)))
    (if (f32.gt (f32x4.extract_lane 1 (local.get $m0)) (local.get $best))
      (then (local.set $best (f32x4.extract_lane 1 (local.get $m0)))))
    (if (f32.gt (f32x4.extract_lane 2 (local.get $m0)) (local.get $best))
      (then (local.set $best (f32x4.extract_lane 2 (local.get $m0)))))
    (if (f32.gt (f32x4.extract_lane 3 (local.get $m0)) (local.get $best))
      (then (local.set $best (f32x4.extract_lane 3 (local.get $m0)))))
    (block $tail_done
      (loop $tail
        (br_if $tail_done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $v (f32.load (i32.add (local.get $p) (i32.shl (local.get $i) (i32.const 2)))))
        (if (f32.gt (local.get $v) (local.get $best)) (then (local.set $best (local.get $v))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $tail)))
    (local.get $best)))
