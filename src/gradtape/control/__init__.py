"""Control flow, above the compiler: loops recorded once (scan, fori_loop, while_loop) and
user-defined derivative rules (custom_vjp, custom_jvp).

These build on every layer below them: the tape and primitives (core), the rules, the
transforms that differentiate a recorded body (transforms.linearize) and the compiler that
turns a body's step into generated code and native drivers (compile).
"""
