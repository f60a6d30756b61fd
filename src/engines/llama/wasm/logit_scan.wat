;; Passes over a vocabulary's logits with 128-bit SIMD, for the sampler (logit_scan.ts).
;; The logits live in this module's memory at byte offset 0; callers pass pointers into it.
;; Rebuild logit_scan_wasm.ts from this file with `deno task wasm` (a test checks that they agree).
(module
  (memory (export "memory") 1)

  ;; range(p, n, lo, hi, out, max): writes the indexes i (ascending) with x[i] >= lo and not x[i] >= hi
  ;; to out as i32 and returns how many, or -1 as soon as there are more than max. hi NaN: no upper
  ;; bound. NaN values are never in range.
  (func (export "range")
    (param $p i32) (param $n i32) (param $lo f32) (param $hi f32) (param $out i32) (param $max i32)
    (result i32)
    (local $i i32) (local $end i32) (local $lov v128) (local $hiv v128) (local $count i32) (local $j i32)
    (local $a i32) (local $v f32)
    (local.set $lov (f32x4.splat (local.get $lo)))
    (local.set $hiv (f32x4.splat (local.get $hi)))
    (local.set $end (i32.and (local.get $n) (i32.const -16)))
    ;; 16 values a round: one test for all of them, a scalar look only where one passed.
    (block $done
      (loop $round
        (br_if $done (i32.ge_u (local.get $i) (local.get $end)))
        (local.set $a (i32.add (local.get $p) (i32.shl (local.get $i) (i32.const 2))))
        (if (v128.any_true
              (v128.or
                (v128.or
                  (v128.andnot (f32x4.ge (v128.load (local.get $a)) (local.get $lov))
                               (f32x4.ge (v128.load (local.get $a)) (local.get $hiv)))
                  (v128.andnot (f32x4.ge (v128.load offset=16 (local.get $a)) (local.get $lov))
                               (f32x4.ge (v128.load offset=16 (local.get $a)) (local.get $hiv))))
                (v128.or
                  (v128.andnot (f32x4.ge (v128.load offset=32 (local.get $a)) (local.get $lov))
                               (f32x4.ge (v128.load offset=32 (local.get $a)) (local.get $hiv)))
                  (v128.andnot (f32x4.ge (v128.load offset=48 (local.get $a)) (local.get $lov))
                               (f32x4.ge (v128.load offset=48 (local.get $a)) (local.get $hiv))))))
          (then
            (local.set $j (i32.const 0))
            (loop $each
              (local.set $v (f32.load (i32.add (local.get $a) (i32.shl (local.get $j) (i32.const 2)))))
              (if (i32.and (f32.ge (local.get $v) (local.get $lo))
                           (i32.eqz (f32.ge (local.get $v) (local.get $hi))))
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
        (local.set $v (f32.load (i32.add (local.get $p) (i32.shl (local.get $i) (i32.const 2)))))
        (if (i32.and (f32.ge (local.get $v) (local.get $lo)) (i32.eqz (f32.ge (local.get $v) (local.get $hi))))
          (then
            (if (i32.ge_u (local.get $count) (local.get $max)) (then (return (i32.const -1))))
            (i32.store (i32.add (local.get $out) (i32.shl (local.get $count) (i32.const 2))) (local.get $i))
            (local.set $count (i32.add (local.get $count) (i32.const 1)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $tail)))
    (local.get $count))

  ;; mass(p, n, t): the sum (in f64) of the x[i] >= t.
  (func (export "mass") (param $p i32) (param $n i32) (param $t f32) (result f64)
    (local $i i32) (local $end i32) (local $tv v128) (local $w v128) (local $s0 v128) (local $s1 v128)
    (local $sum f64) (local $v f32)
    (local.set $tv (f32x4.splat (local.get $t)))
    (local.set $end (i32.and (local.get $n) (i32.const -4)))
    (block $done
      (loop $round
        (br_if $done (i32.ge_u (local.get $i) (local.get $end)))
        (local.set $w (v128.load (i32.add (local.get $p) (i32.shl (local.get $i) (i32.const 2)))))
        (local.set $w (v128.and (local.get $w) (f32x4.ge (local.get $w) (local.get $tv))))
        (local.set $s0 (f64x2.add (local.get $s0) (f64x2.promote_low_f32x4 (local.get $w))))
        (local.set $s1 (f64x2.add (local.get $s1) (f64x2.promote_low_f32x4
          (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $w) (local.get $w)))))
        (local.set $i (i32.add (local.get $i) (i32.const 4)))
        (br $round)))
    (local.set $s0 (f64x2.add (local.get $s0) (local.get $s1)))
    (local.set $sum (f64.add (f64x2.extract_lane 0 (local.get $s0)) (f64x2.extract_lane 1 (local.get $s0))))
    (block $tail_done
      (loop $tail
        (br_if $tail_done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $v (f32.load (i32.add (local.get $p) (i32.shl (local.get $i) (i32.const 2)))))
        (if (f32.ge (local.get $v) (local.get $t))
          (then (local.set $sum (f64.add (local.get $sum) (f64.promote_f32 (local.get $v))))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $tail)))
    (local.get $sum))

  ;; clip(p, n, t): sets the x[i] below t (and NaN) to 0; returns the sum (in f64) of what is left.
  (func (export "clip") (param $p i32) (param $n i32) (param $t f32) (result f64)
    (local $i i32) (local $end i32) (local $a i32) (local $tv v128) (local $w v128) (local $s0 v128)
    (local $s1 v128) (local $sum f64) (local $v f32)
    (local.set $tv (f32x4.splat (local.get $t)))
    (local.set $end (i32.and (local.get $n) (i32.const -4)))
    (block $done
      (loop $round
        (br_if $done (i32.ge_u (local.get $i) (local.get $end)))
        (local.set $a (i32.add (local.get $p) (i32.shl (local.get $i) (i32.const 2))))
        (local.set $w (v128.load (local.get $a)))
        (local.set $w (v128.and (local.get $w) (f32x4.ge (local.get $w) (local.get $tv))))
        (v128.store (local.get $a) (local.get $w))
        (local.set $s0 (f64x2.add (local.get $s0) (f64x2.promote_low_f32x4 (local.get $w))))
        (local.set $s1 (f64x2.add (local.get $s1) (f64x2.promote_low_f32x4
          (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $w) (local.get $w)))))
        (local.set $i (i32.add (local.get $i) (i32.const 4)))
        (br $round)))
    (local.set $s0 (f64x2.add (local.get $s0) (local.get $s1)))
    (local.set $sum (f64.add (f64x2.extract_lane 0 (local.get $s0)) (f64x2.extract_lane 1 (local.get $s0))))
    (block $tail_done
      (loop $tail
        (br_if $tail_done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $a (i32.add (local.get $p) (i32.shl (local.get $i) (i32.const 2))))
        (local.set $v (f32.load (local.get $a)))
        (if (f32.ge (local.get $v) (local.get $t))
          (then (local.set $sum (f64.add (local.get $sum) (f64.promote_f32 (local.get $v)))))
          (else (f32.store (local.get $a) (f32.const 0))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $tail)))
    (local.get $sum))

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
    (local.get $best))

  ;; weights(p, n, best, inv, floor, out): out[i] = exp((x[i] - best) * inv) where x[i] >= floor, else
  ;; 0 (NaN: 0); returns the sum of out (accumulated in f64). With x[i] <= best and a floor no more
  ;; than 87 / inv below best, the exponent lies in [-87, 0]: exp is 2^k * e^r, r in [-ln2/2, ln2/2],
  ;; e^r a degree-6 polynomial (relative error under 2e-7, about float32's own rounding).
  (func (export "weights")
    (param $p i32) (param $n i32) (param $best f32) (param $inv f32) (param $floor f32) (param $out i32)
    (result f64)
    (local $i i32) (local $end i32) (local $a i32) (local $o i32)
    (local $v v128) (local $y v128) (local $k v128) (local $r v128) (local $e v128) (local $w v128)
    (local $s0 v128) (local $s1 v128) (local $sum f64) (local $x f32) (local $one f32)
    (local.set $end (i32.and (local.get $n) (i32.const -4)))
    (block $done
      (loop $round
        (br_if $done (i32.ge_u (local.get $i) (local.get $end)))
        (local.set $a (i32.add (local.get $p) (i32.shl (local.get $i) (i32.const 2))))
        (local.set $o (i32.add (local.get $out) (i32.shl (local.get $i) (i32.const 2))))
        (local.set $v (v128.load (local.get $a)))
        ;; y = max((v - best) * inv, -87)
        (local.set $y (f32x4.pmax (f32x4.splat (f32.const -87))
          (f32x4.mul (f32x4.sub (local.get $v) (f32x4.splat (local.get $best))) (f32x4.splat (local.get $inv)))))
        ;; k = nearest(y / ln2); r = y - k ln2 (ln2 split in two for precision)
        (local.set $k (f32x4.nearest (f32x4.mul (local.get $y) (f32x4.splat (f32.const 1.44269504)))))
        (local.set $r (f32x4.sub
          (f32x4.sub (local.get $y) (f32x4.mul (local.get $k) (f32x4.splat (f32.const 0.693145752))))
          (f32x4.mul (local.get $k) (f32x4.splat (f32.const 1.42860677e-6)))))
        ;; e^r, Horner: 1 + r(1 + r(1/2 + r(1/6 + r(1/24 + r(1/120 + r/720)))))
        (local.set $e (f32x4.add (f32x4.splat (f32.const 0.00833333377))
          (f32x4.mul (local.get $r) (f32x4.splat (f32.const 0.00138888892)))))
        (local.set $e (f32x4.add (f32x4.splat (f32.const 0.0416666679)) (f32x4.mul (local.get $r) (local.get $e))))
        (local.set $e (f32x4.add (f32x4.splat (f32.const 0.166666672)) (f32x4.mul (local.get $r) (local.get $e))))
        (local.set $e (f32x4.add (f32x4.splat (f32.const 0.5)) (f32x4.mul (local.get $r) (local.get $e))))
        (local.set $e (f32x4.add (f32x4.splat (f32.const 1)) (f32x4.mul (local.get $r) (local.get $e))))
        (local.set $e (f32x4.add (f32x4.splat (f32.const 1)) (f32x4.mul (local.get $r) (local.get $e))))
        ;; times 2^k: k + 127 in the exponent bits
        (local.set $e (f32x4.mul (local.get $e)
          (i32x4.shl (i32x4.add (i32x4.trunc_sat_f32x4_s (local.get $k)) (i32x4.splat (i32.const 127)))
                     (i32.const 23))))
        (local.set $w (v128.and (local.get $e) (f32x4.ge (local.get $v) (f32x4.splat (local.get $floor)))))
        (v128.store (local.get $o) (local.get $w))
        (local.set $s0 (f64x2.add (local.get $s0) (f64x2.promote_low_f32x4 (local.get $w))))
        (local.set $s1 (f64x2.add (local.get $s1) (f64x2.promote_low_f32x4
          (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $w) (local.get $w)))))
        (local.set $i (i32.add (local.get $i) (i32.const 4)))
        (br $round)))
    (local.set $s0 (f64x2.add (local.get $s0) (local.get $s1)))
    (local.set $sum (f64.add (f64x2.extract_lane 0 (local.get $s0)) (f64x2.extract_lane 1 (local.get $s0))))
    ;; The last n % 4 values, one lane at a time through the same code.
    (block $tail_done
      (loop $tail
        (br_if $tail_done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $x (f32.load (i32.add (local.get $p) (i32.shl (local.get $i) (i32.const 2)))))
        (local.set $v (f32x4.splat (local.get $x)))
        (local.set $y (f32x4.pmax (f32x4.splat (f32.const -87))
          (f32x4.mul (f32x4.sub (local.get $v) (f32x4.splat (local.get $best))) (f32x4.splat (local.get $inv)))))
        (local.set $k (f32x4.nearest (f32x4.mul (local.get $y) (f32x4.splat (f32.const 1.44269504)))))
        (local.set $r (f32x4.sub
          (f32x4.sub (local.get $y) (f32x4.mul (local.get $k) (f32x4.splat (f32.const 0.693145752))))
          (f32x4.mul (local.get $k) (f32x4.splat (f32.const 1.42860677e-6)))))
        (local.set $e (f32x4.add (f32x4.splat (f32.const 0.00833333377))
          (f32x4.mul (local.get $r) (f32x4.splat (f32.const 0.00138888892)))))
        (local.set $e (f32x4.add (f32x4.splat (f32.const 0.0416666679)) (f32x4.mul (local.get $r) (local.get $e))))
        (local.set $e (f32x4.add (f32x4.splat (f32.const 0.166666672)) (f32x4.mul (local.get $r) (local.get $e))))
        (local.set $e (f32x4.add (f32x4.splat (f32.const 0.5)) (f32x4.mul (local.get $r) (local.get $e))))
        (local.set $e (f32x4.add (f32x4.splat (f32.const 1)) (f32x4.mul (local.get $r) (local.get $e))))
        (local.set $e (f32x4.add (f32x4.splat (f32.const 1)) (f32x4.mul (local.get $r) (local.get $e))))
        (local.set $e (f32x4.mul (local.get $e)
          (i32x4.shl (i32x4.add (i32x4.trunc_sat_f32x4_s (local.get $k)) (i32x4.splat (i32.const 127)))
                     (i32.const 23))))
        (local.set $w (v128.and (local.get $e) (f32x4.ge (local.get $v) (f32x4.splat (local.get $floor)))))
        (local.set $one (f32x4.extract_lane 0 (local.get $w)))
        (f32.store (i32.add (local.get $out) (i32.shl (local.get $i) (i32.const 2))) (local.get $one))
        (local.set $sum (f64.add (local.get $sum) (f64.promote_f32 (local.get $one))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $tail)))
    (local.get $sum))

  ;; pick(w, n, r): the first i (w[i] != 0) where r minus the weights so far, w[i] included, is <= 0
  ;; (in f64, as JavaScript computes it); the last nonzero i when r is never used up; -1 when all are 0.
  (func (export "pick") (param $w i32) (param $n i32) (param $r f64) (result i32)
    (local $i i32) (local $last i32) (local $v f32)
    (local.set $last (i32.const -1))
    (block $done
      (loop $each
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $v (f32.load (i32.add (local.get $w) (i32.shl (local.get $i) (i32.const 2)))))
        (if (f32.ne (local.get $v) (f32.const 0))
          (then
            (local.set $last (local.get $i))
            (local.set $r (f64.sub (local.get $r) (f64.promote_f32 (local.get $v))))
            (if (f64.le (local.get $r) (f64.const 0)) (then (return (local.get $i))))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $each)))
    (local.get $last))

  ;; top(p, n, k, vals, idx): the k largest x[i] (NaN and -Infinity left out), best first and equal
  ;; values by lower index, as f32 at vals and i32 at idx; returns how many (at most k). One pass: 16
  ;; values a round against the k-th best so far, a scalar insertion only where one beats it.
  (func (export "top") (param $p i32) (param $n i32) (param $k i32) (param $vals i32) (param $idx i32)
    (result i32)
    (local $i i32) (local $end i32) (local $a i32) (local $count i32) (local $j i32)
    (local $thr f32) (local $thrv v128) (local $v f32)
    (if (i32.le_s (local.get $k) (i32.const 0)) (then (return (i32.const 0))))
    (local.set $thr (f32.const -inf))
    (local.set $thrv (f32x4.splat (local.get $thr)))
    (local.set $end (i32.and (local.get $n) (i32.const -16)))
    (block $done
      (loop $round
        (br_if $done (i32.ge_u (local.get $i) (local.get $end)))
        (local.set $a (i32.add (local.get $p) (i32.shl (local.get $i) (i32.const 2))))
        (if (v128.any_true
              (v128.or
                (v128.or (f32x4.gt (v128.load (local.get $a)) (local.get $thrv))
                         (f32x4.gt (v128.load offset=16 (local.get $a)) (local.get $thrv)))
                (v128.or (f32x4.gt (v128.load offset=32 (local.get $a)) (local.get $thrv))
                         (f32x4.gt (v128.load offset=48 (local.get $a)) (local.get $thrv)))))
          (then
            (local.set $j (i32.const 0))
            (loop $each
              (local.set $v (f32.load (i32.add (local.get $a) (i32.shl (local.get $j) (i32.const 2)))))
              (if (f32.gt (local.get $v) (local.get $thr))
                (then
                  (local.set $count (call $insert (local.get $v) (i32.add (local.get $i) (local.get $j))
                    (local.get $count) (local.get $k) (local.get $vals) (local.get $idx)))
                  (if (i32.ge_u (local.get $count) (local.get $k))
                    (then
                      (local.set $thr (f32.load (i32.add (local.get $vals)
                        (i32.shl (i32.sub (local.get $k) (i32.const 1)) (i32.const 2)))))
                      (local.set $thrv (f32x4.splat (local.get $thr)))))))
              (local.set $j (i32.add (local.get $j) (i32.const 1)))
              (br_if $each (i32.lt_u (local.get $j) (i32.const 16))))))
        (local.set $i (i32.add (local.get $i) (i32.const 16)))
        (br $round)))
    ;; The last n % 16 values.
    (block $tail_done
      (loop $tail
        (br_if $tail_done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $v (f32.load (i32.add (local.get $p) (i32.shl (local.get $i) (i32.const 2)))))
        (if (f32.gt (local.get $v) (local.get $thr))
          (then
            (local.set $count (call $insert (local.get $v) (local.get $i)
              (local.get $count) (local.get $k) (local.get $vals) (local.get $idx)))
            (if (i32.ge_u (local.get $count) (local.get $k))
              (then
                (local.set $thr (f32.load (i32.add (local.get $vals)
                  (i32.shl (i32.sub (local.get $k) (i32.const 1)) (i32.const 2)))))))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $tail)))
    (local.get $count))

  ;; insert(v, i, count, k, vals, idx): puts v (index i) into the descending list of count entries (k
  ;; at most: a full list loses its last), after the entries it does not beat; returns the new count.
  (func $insert (param $v f32) (param $i i32) (param $count i32) (param $k i32) (param $vals i32)
    (param $idx i32) (result i32)
    (local $j i32) (local $at i32)
    (if (i32.lt_u (local.get $count) (local.get $k))
      (then
        (local.set $j (local.get $count))
        (local.set $count (i32.add (local.get $count) (i32.const 1))))
      (else (local.set $j (i32.sub (local.get $k) (i32.const 1)))))
    (block $placed
      (loop $shift
        (br_if $placed (i32.eqz (local.get $j)))
        (local.set $at (i32.shl (local.get $j) (i32.const 2)))
        (br_if $placed (i32.eqz (f32.lt (f32.load offset=0 (i32.sub (i32.add (local.get $vals) (local.get $at)) (i32.const 4)))
                                        (local.get $v))))
        (f32.store (i32.add (local.get $vals) (local.get $at))
                   (f32.load (i32.sub (i32.add (local.get $vals) (local.get $at)) (i32.const 4))))
        (i32.store (i32.add (local.get $idx) (local.get $at))
                   (i32.load (i32.sub (i32.add (local.get $idx) (local.get $at)) (i32.const 4))))
        (local.set $j (i32.sub (local.get $j) (i32.const 1)))
        (br $shift)))
    (f32.store (i32.add (local.get $vals) (i32.shl (local.get $j) (i32.const 2))) (local.get $v))
    (i32.store (i32.add (local.get $idx) (i32.shl (local.get $j) (i32.const 2))) (local.get $i))
    (local.get $count))
)
