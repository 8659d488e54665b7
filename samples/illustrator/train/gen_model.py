"""Writes ../model.loom: the illustrator's UNet written out block by block.

The `.loom` command language has no per-block abstraction that can also select a block's
own LoRA family (a called command cannot take a family, and a command `if` cannot branch on
an argument), so the six residual blocks are spelled out; this script spells them, from the
same block table as train/model.py, so the two cannot drift. Run it after changing either.
"""

from pathlib import Path

HEAD = '''// The illustrator's provider: the `generate` stage (control.loom). Prompts are embedded by
// the text encoder (text.loom); the UNet (train/model.py's reference, op for op) then denoises
// seeded Gaussian noise with the rectified-flow Euler sampler and classifier-free guidance,
// and the result is quantised to RGB8.
//
// Layout: channels-last token rows (std:unet.loom): pixel (y, x) of image b is row
// (b * h + y) * w + x. The guidance batch is 2B images: rows of images 0..B are conditioned on
// their prompts, rows of images B..2B on nothing (the zero text vector), the same latents.
// (The UNet body below is written out block by block by train/gen_model.py.)

use "config.loom" { width, height, adapters, channels, steps, guidance, c0, c1, c2, cond, time_freqs, groups, unet_heads, gn_eps, unet_attn_scale, dim, layout_hidden, layout_channels, layout_side }
use "prepare.loom" { time1_w, time1_b, time2_w, time2_b, text_w, text_b, layout1_w, layout1_b, layout2_w, layout2_b, @PARAMS@ }
use "text.loom" { encode_prompts }
use "std:unet.loom" { group_norm_stats, group_norm_apply, group_norm_apply_silu, group_norm_apply_film_silu, upsample_nearest2x, concat_channels, lora_conv_add, timestep_embedding, gaussian_noise, fill, repeat_rows, with_null_rows, cfg_euler_step, to_pixels, map_rows }
use "std:encoders.loom" { bias_add }
use "std:activations.loom" { silu, residual_add }

// One UNet evaluation: the velocity v of latents x (2B images) under conditioning c
// (time and text, one row per image), the prompts' layout maps at quarter resolution and
// per-image adapter scales.
command unet(c: f32[B2, cond], scales: f32[B2, A], layout: f32[B2 * (height / 4) * (width / 4), layout_channels], x: f32[B2 * height * width, channels]) -> (v: f32[B2 * height * width, channels]) {
'''
TAIL = '''}

// The conditioning vector of every image at time t: SiLU(time MLP(sinusoid(t)) + text_c),
// text_c being the text projection (computed once per call).
command condition(t: f32[B2], text_c: f32[B2, cond]) -> (c: f32[B2, cond]) {
    var temb: f32[B2, 2 * time_freqs]
    var a: f32[B2, cond]
    var b: f32[B2, cond]
    timestep_embedding(t, temb)
    matmul(temb, time1_w, a)
    bias_add(a, time1_b)
    silu(a, b)
    matmul(b, time2_w, a)
    bias_add(a, time2_b)
    residual_add(a, text_c)
    silu(a, c)
}

command generate(tokens: i32[T], positions: i32[T], seq: i32[T], starts: i32[B], lengths: i32[B], seed: u64[B], scales: f32[B, A]) -> (image: u8[B, height, width, channels]) {
    var text: f32[B, dim]
    var text2: f32[2 * B, dim]
    var text_c: f32[2 * B, cond]
    var scales2: f32[2 * B, A]
    var t: f32[2 * B]
    var c: f32[2 * B, cond]
    var x: f32[B * height * width, channels]
    var x2: f32[2 * B * height * width, channels]
    var v: f32[2 * B * height * width, channels]
    var lay_a: f32[2 * B, layout_hidden]
    var lay_b: f32[2 * B, layout_hidden]
    var lay_v: f32[2 * B, layout_channels * layout_side * layout_side]
    var layout: f32[2 * B * (height / 4) * (width / 4), layout_channels]
    encode_prompts(tokens, positions, seq, starts, lengths, text)
    with_null_rows(text, text2)
    matmul(text2, text_w, text_c)
    bias_add(text_c, text_b)
    // The prompts' layout maps (constant over the steps): SiLU MLP, then the map resized.
    matmul(text2, layout1_w, lay_a)
    bias_add(lay_a, layout1_b)
    silu(lay_a, lay_b)
    matmul(lay_b, layout2_w, lay_v)
    bias_add(lay_v, layout2_b)
    map_rows(lay_v, layout_side, height / 4, width / 4, layout)
    repeat_rows(scales, scales2)
    gaussian_noise(seed, x)
    for i in 0..steps {
        fill(t, 1.0 - f32(i) / f32(steps))
        condition(t, text_c, c)
        repeat_rows(x, x2)
        unet(c, scales2, layout, x2, v)
        cfg_euler_step(v, guidance, 1.0 / f32(steps), x)
    }
    to_pixels(x, image)
}
'''

blocks = {"down0": ("c0", "c0"), "down1": ("c0", "c1"), "mid0": ("c1 + layout_channels", "c2"), "mid1": ("c2", "c2"), "up1": ("c2 + c1", "c1"), "up0": ("c1 + c0", "c0")}
level = {0: ("N0", "height", "width", "p0"), 1: ("N1", "height / 2", "width / 2", "p1"), 2: ("N2", "height / 4", "width / 4", "p2")}
rows = {0: "B2 * height * width", 1: "B2 * (height / 2) * (width / 2)", 2: "B2 * (height / 4) * (width / 4)"}
scratch = {}
def var(lv, width):
    key = (lv, width)
    if key not in scratch:
        scratch[key] = f"s{lv}_{len([k for k in scratch if k[0] == lv])}"
    return scratch[key]
body = []
named = []
stats_of = {}


def stats(width):
    """The group_norm_stats scratch of a width (one per channel count, any level)."""
    if width not in stats_of:
        stats_of[width] = "gn_" + width.replace(" + ", "_")
        named.append((stats_of[width], f"B2, 2 * ({width})" if " " in width else f"B2, 2 * {width}"))
    return stats_of[width]


def res(b, x, lv, out):
    ci, co = blocks[b]
    hh, ww, p = level[lv][1], level[lv][2], level[lv][3]
    a = var(lv, ci); h = var(lv, co + "#h"); g = var(lv, co + "#g")
    L = [f"    // {b}: Res({ci} -> {co})",
         f"    group_norm_stats({x}, {p}, groups, gn_eps, {stats(ci)})",
         f"    group_norm_apply_silu({x}, {stats(ci)}, {p}, {b}_n1_w, {b}_n1_b, {a})",
         f"    conv3x3({a}, {b}_c1_w, {b}_c1_b, {hh}, {ww}, 1, {h})",
         f"    for a in 0..adapters {{",
         f"        lora_conv_add({a}, {hh}, {ww}, {b}_c1_la[a], {b}_c1_lb[a], scales, a, {h})",
         f"    }}",
         f"    matmul(c, {b}_film_w, ss_{b})",
         f"    bias_add(ss_{b}, {b}_film_b)",
         f"    group_norm_stats({h}, {p}, groups, gn_eps, {stats(co)})",
         f"    group_norm_apply_film_silu({h}, {stats(co)}, {p}, {b}_n2_w, {b}_n2_b, ss_{b}, {g})",
         f"    conv3x3({g}, {b}_c2_w, {b}_c2_b, {hh}, {ww}, 1, {out})",
         f"    for a in 0..adapters {{",
         f"        lora_conv_add({g}, {hh}, {ww}, {b}_c2_la[a], {b}_c2_lb[a], scales, a, {out})",
         f"    }}"]
    named.append((f"ss_{b}", f"B2, 2 * {co}"))
    if ci != co:
        sk = var(lv, co + "#skip")
        L += [f"    matmul({x}, {b}_skip_w, {sk})", f"    bias_add({sk}, {b}_skip_b)", f"    residual_add({out}, {sk})"]
    else:
        L += [f"    residual_add({out}, {x})"]
    body.extend(L)

def named_var(name, lv, width):
    named.append((name, f"{rows[lv]}, {width}"))
    return name

h0 = named_var("h0", 0, "c0")
s0 = named_var("skip0", 0, "c0")
body += ["    // conv_in", f"    conv3x3(x, conv_in_w, conv_in_b, height, width, 1, {h0})"]
res("down0", h0, 0, s0)
h1 = named_var("h1", 1, "c0"); s1 = named_var("skip1", 1, "c1")
body += ["    // pool0: conv 3x3 stride 2", f"    conv3x3({s0}, pool0_w, pool0_b, height, width, 2, {h1})"]
res("down1", h1, 1, s1)
h2 = named_var("h2", 2, "c1"); m0 = named_var("m0", 2, "c2"); m1 = named_var("m1", 2, "c2")
body += ["    // pool1: conv 3x3 stride 2", f"    conv3x3({s1}, pool1_w, pool1_b, height / 2, width / 2, 2, {h2})"]
body += ["    // the prompts' layout maps join the features", "    concat_channels(h2, layout, mid_in)"]
named.append(("mid_in", f"{rows[2]}, c1 + layout_channels"))
res("mid0", "mid_in", 2, m0)
an = named_var("attn_in", 2, "c2"); qkv = named_var("attn_qkv", 2, "3 * c2"); att = named_var("attn_o", 2, "c2"); ap = named_var("attn_proj", 2, "c2")
body += ["    // Self-attention over the (h/4) x (w/4) tokens of each image and each head (the",
         "    // `attention` motif), residual.",
         f"    group_norm_stats(m0, p2, groups, gn_eps, {stats('c2')})",
         f"    group_norm_apply(m0, {stats('c2')}, p2, attn_norm_w_u, attn_norm_b_u, {an})",
         f"    matmul({an}, attn_qkv_w, {qkv})", f"    bias_add({qkv}, attn_qkv_b)",
         f"    attention({qkv}, unet_heads, (height / 4) * (width / 4), unet_attn_scale, {att})",
         f"    matmul({att}, attn_out_w, {ap})", f"    bias_add({ap}, attn_out_b)", f"    residual_add(m0, {ap})"]
res("mid1", "m0", 2, m1)
u1 = named_var("up1_in", 1, "c2"); cat1 = named_var("up1_cat", 1, "c2 + c1"); o1 = named_var("up1_out", 1, "c1")
body += ["    // up1: nearest x2, then the skip", f"    upsample_nearest2x(m1, height / 4, width / 4, {u1})", f"    concat_channels({u1}, skip1, {cat1})"]
res("up1", cat1, 1, o1)
u0 = named_var("up0_in", 0, "c1"); cat0 = named_var("up0_cat", 0, "c1 + c0"); o0 = named_var("up0_out", 0, "c0")
body += ["    // up0: nearest x2, then the skip", f"    upsample_nearest2x({o1}, height / 2, width / 2, {u0})", f"    concat_channels({u0}, skip0, {cat0})"]
res("up0", cat0, 0, o0)
on = named_var("out_norm", 0, "c0")
body += ["    // out: GroupNorm, SiLU, conv 3x3 to RGB", f"    group_norm_stats({o0}, p0, groups, gn_eps, {stats('c0')})",
         f"    group_norm_apply_silu({o0}, {stats('c0')}, p0, norm_out_w, norm_out_b, {on})",
         f"    conv3x3({on}, conv_out_w, conv_out_b, height, width, 1, v)"]
decl = []
for (lv, width), name in scratch.items():
    decl.append(f"    var {name}: f32[{rows[lv]}, {width.split('#')[0]}]")
for name, dims in named:
    decl.append(f"    var {name}: f32[{dims}]")
lets = ["    let p0 = height * width", "    let p1 = (height / 2) * (width / 2)", "    let p2 = (height / 4) * (width / 4)"]
params = ["conv_in_w", "conv_in_b", "pool0_w", "pool0_b", "pool1_w", "pool1_b", "attn_norm_w_u", "attn_norm_b_u", "attn_qkv_w", "attn_qkv_b", "attn_out_w", "attn_out_b", "norm_out_w", "norm_out_b", "conv_out_w", "conv_out_b"]
for b, (ci, co) in blocks.items():
    params += [f"{b}_{s}" for s in ("n1_w", "n1_b", "c1_w", "c1_b", "film_w", "film_b", "n2_w", "n2_b", "c2_w", "c2_b", "c1_la", "c1_lb", "c2_la", "c2_lb")]
    if ci != co:
        params += [f"{b}_skip_w", f"{b}_skip_b"]
head = HEAD.replace("@PARAMS@", ", ".join(params))
tail = TAIL
open(Path(__file__).resolve().parents[1] / "model.loom", "w").write(head + "\n".join(decl + lets + body) + "\n" + tail)
