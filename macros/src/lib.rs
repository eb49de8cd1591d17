//! `#[kernel]` (re-exported as `gdaki_device::kernel`): makes a Rust function a kernel that both executors can
//! launch, as Rust-CUDA's `cuda_std::kernel` does for the GPU alone.
//!
//! ```ignore
//! #[kernel]
//! pub fn ping(t: &Thread, ch: &PortChannelHandle, n: u64) -> Result<()> { .. }
//! ```
//! keeps `ping` as it is (an ordinary function, callable from other device code) and adds:
//! - on `nvptx64`: the PTX entry `ping`, an `extern "ptx-kernel"` function taking the parameters after the
//!   `&Thread` at their launch types (a `&T`, `*const T` or `*mut T` is a `DevPtr<T>`: one device address)
//!   and one hidden last `u64`, the address of the launch's `ErrorReport`; it calls `ping` with the calling
//!   thread and records what it returns;
//! - on the host: `pub static PING: gdaki_device::launch::KernelFn<(DevPtr<PortChannelHandle>, u64)>`, the
//!   kernel's name and the same call for the `cpu` executor's host threads, which `gdaki::launch` launches.
//!
//! Rules, checked at compile time: the first parameter is a `&Thread`; at most 8 others, plain identifiers whose
//! types are references (`&T`, not `&mut T`: many threads hold it), raw pointers, or `DeviceRepr` values, each
//! to or of a sized type (no slice, `str` or trait object: a pointer crosses the launch as one address); no
//! generics, no `impl Trait`, no `async`; the name has a lowercase letter (the descriptor is the name in upper case, which must
//! differ from the function's), and a raw name (`r#loop`) is taken without its `r#`; the return type is `()` or
//! a `Result<(), E>` with `E: Into<gdaki_device::Error>`.
//! The crate that uses it needs `#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]` for the entry's ABI.

use proc_macro::TokenStream;
use proc_macro2::Span;
use quote::{format_ident, quote};
use syn::{ext::IdentExt, parse_macro_input, spanned::Spanned, FnArg, ItemFn, Pat, Type};

/// Most parameters after the `&Thread`: the launch's argument tuples (`gdaki_device::launch::LaunchArgs`) go to 8.
const MAX_PARAMS: usize = 8;

/// How a parameter crosses the launch.
enum Param {
    /// `&T` or `*const T` / `*mut T`: a `DevPtr<T>` at launch, turned back into the parameter's type.
    Pointer { elem: Type, reference: bool, mutable: bool },
    /// Any other type, by value.
    Value(Type),
}

/// Makes the function a kernel (see the crate docs).
#[proc_macro_attribute]
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    if !attr.is_empty() {
        return syn::Error::new(Span::call_site(), "#[kernel] takes no arguments").to_compile_error().into();
    }
    let f = parse_macro_input!(item as ItemFn);
    match expand(&f) {
        Ok(t) => t.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

fn expand(f: &ItemFn) -> syn::Result<proc_macro2::TokenStream> {
    let sig = &f.sig;
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        return Err(syn::Error::new(sig.generics.span(), "a kernel cannot be generic: its entry has one PTX name"));
    }
    if let Some(a) = &sig.asyncness {
        return Err(syn::Error::new(a.span(), "a kernel cannot be async"));
    }
    if let Some(v) = &sig.variadic {
        return Err(syn::Error::new(v.span(), "a kernel cannot be variadic"));
    }
    let mut inputs = sig.inputs.iter();
    match inputs.next() {
        Some(FnArg::Typed(t)) if is_thread_ref(&t.ty) => {}
        Some(other) => return Err(syn::Error::new(other.span(), "a kernel's first parameter is `t: &Thread`")),
        None => return Err(syn::Error::new(sig.span(), "a kernel's first parameter is `t: &Thread`")),
    }
    let mut params = Vec::new();
    for input in inputs {
        let FnArg::Typed(t) = input else {
            return Err(syn::Error::new(input.span(), "a kernel is a free function"));
        };
        if !matches!(&*t.pat, Pat::Ident(_)) {
            return Err(syn::Error::new(t.pat.span(), "a kernel's parameters are plain names"));
        }
        params.push(classify(&t.ty)?);
    }
    if params.len() > MAX_PARAMS {
        return Err(syn::Error::new(
            sig.inputs.span(),
            format!(
                "a kernel takes at most {MAX_PARAMS} parameters after `t: &Thread` (it has {}): gather the rest in a \
                 `#[repr(C)]` struct passed by reference",
                params.len()
            ),
        ));
    }

    let name = &sig.ident;
    // `r#loop` names the PTX entry `loop` and the descriptor `LOOP` (an `r#` inside either is no identifier).
    let name_str = name.unraw().to_string();
    if name_str.to_uppercase() == name_str {
        return Err(syn::Error::new(
            name.span(),
            format!(
                "a kernel's name needs a lowercase letter: its descriptor is `{name_str}` in upper case, the \
                 function's own name"
            ),
        ));
    }
    let entry = format_ident!("__gdaki_kernel_{}", name);
    let host = format_ident!("__gdaki_host_{}", name);
    let upper = format_ident!("{}", name_str.to_uppercase());
    let abi: Vec<proc_macro2::TokenStream> = params
        .iter()
        .map(|p| match p {
            Param::Pointer { elem, .. } => quote!(::gdaki_device::launch::DevPtr<#elem>),
            Param::Value(ty) => quote!(#ty),
        })
        .collect();
    let args: Vec<_> = (0..params.len()).map(|i| format_ident!("a{}", i)).collect();
    // Turns the launch value `v` of parameter `p` back into the function's parameter.
    let back = |p: &Param, v: proc_macro2::TokenStream| match p {
        Param::Pointer { elem, reference: true, .. } => quote!(unsafe { &*((#v).addr() as *const #elem) }),
        Param::Pointer { elem, mutable: true, .. } => quote!(((#v).addr() as *mut #elem)),
        Param::Pointer { elem, .. } => quote!(((#v).addr() as *const #elem)),
        Param::Value(_) => v,
    };
    let entry_calls: Vec<_> = params.iter().zip(&args).map(|(p, a)| back(p, quote!(#a))).collect();
    let host_calls: Vec<_> = params
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let i = syn::Index::from(i);
            back(p, quote!(args.#i))
        })
        .collect();
    let doc = format!(
        "The kernel [`{name_str}`] as the host launches it (`gdaki::launch`): its PTX entry and its host twin."
    );
    Ok(quote! {
        // A kernel's pointer parameters are the launch's (which is `unsafe`), so dereferencing them in a safe
        // function is the kernel's contract, not a hidden unsafety.
        #[allow(clippy::not_unsafe_ptr_arg_deref)]
        #f

        #[cfg(target_arch = "nvptx64")]
        #[doc(hidden)]
        #[unsafe(export_name = #name_str)]
        // An array parameter by value (`[u64; 4]`, a `DeviceRepr`) is a `.param` byte array of the kernel in
        // PTX, which the launch fills from the same bytes: rustc's C-ABI lint has no say over the PTX ABI.
        #[allow(improper_ctypes_definitions)]
        pub unsafe extern "ptx-kernel" fn #entry(#(#args: #abi,)* __gdaki_report: u64) {
            let __gdaki_thread = ::gdaki_device::thread::Thread::current();
            // SAFETY (of the pointer parameters): the launch passed device addresses that the kernel's contract
            // makes valid for its run (`gdaki::launch::Kernel::launch` is `unsafe` for that reason).
            #[allow(clippy::undocumented_unsafe_blocks)]
            let __gdaki_ret = #name(&__gdaki_thread, #(#entry_calls),*);
            ::gdaki_device::launch::KernelReturn::report(__gdaki_ret, __gdaki_report);
        }

        #[cfg(not(target_arch = "nvptx64"))]
        #[doc(hidden)]
        fn #host(t: &::gdaki_device::thread::Thread, args: &(#(#abi,)*), report: u64) {
            // SAFETY: as the entry's.
            #[allow(clippy::undocumented_unsafe_blocks, unused_variables)]
            let __gdaki_ret = #name(t, #(#host_calls),*);
            ::gdaki_device::launch::KernelReturn::report(__gdaki_ret, report);
        }

        #[cfg(not(target_arch = "nvptx64"))]
        #[doc = #doc]
        pub static #upper: ::gdaki_device::launch::KernelFn<(#(#abi,)*)> =
            ::gdaki_device::launch::KernelFn { name: #name_str, host: #host };
    })
}

/// Whether `ty` is `&Thread` (any path ending in `Thread`).
fn is_thread_ref(ty: &Type) -> bool {
    match ty {
        Type::Reference(r) if r.mutability.is_none() => {
            matches!(&*r.elem, Type::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "Thread"))
        }
        _ => false,
    }
}

fn classify(ty: &Type) -> syn::Result<Param> {
    let pointee = match ty {
        Type::Reference(r) => Some(&*r.elem),
        Type::Ptr(p) => Some(&*p.elem),
        _ => None,
    };
    if let Type::ImplTrait(_) = ty {
        return Err(syn::Error::new(
            ty.span(),
            "a kernel parameter cannot be `impl Trait`: a kernel is not generic (its entry has one PTX name)",
        ));
    }
    match pointee {
        Some(Type::Slice(_)) => {
            return Err(syn::Error::new(
                ty.span(),
                "a kernel parameter cannot be a slice: its launch value is one device address; take `*const T` \
                 (or `*mut T`) and the length as a second parameter",
            ))
        }
        Some(Type::Path(p)) if p.qself.is_none() && p.path.is_ident("str") => {
            return Err(syn::Error::new(
                ty.span(),
                "a kernel parameter cannot be a `str`: its launch value is one device address; take `*const u8` \
                 and the length",
            ))
        }
        Some(Type::TraitObject(_) | Type::ImplTrait(_)) => {
            return Err(syn::Error::new(
                ty.span(),
                "a kernel parameter cannot point to a trait object: its launch value is one device address of a \
                 sized type",
            ))
        }
        _ => {}
    }
    Ok(match ty {
        Type::Reference(r) if r.mutability.is_some() => {
            return Err(syn::Error::new(
                r.span(),
                "a kernel parameter cannot be `&mut T`: every thread of the launch gets it; take `*mut T`",
            ))
        }
        Type::Reference(r) => Param::Pointer { elem: (*r.elem).clone(), reference: true, mutable: false },
        Type::Ptr(p) => Param::Pointer { elem: (*p.elem).clone(), reference: false, mutable: p.mutability.is_some() },
        other => Param::Value(other.clone()),
    })
}

#[cfg(test)]
mod tests {
    use super::expand;

    /// A raw name is taken without its `r#` (it made `format_ident!` panic on `R#LOOP`); a name without a
    /// lowercase letter is refused with a message (its descriptor would have been the function's own name).
    #[test]
    fn raw_and_upper_case_names() {
        let f: syn::ItemFn = syn::parse_quote!(
            pub fn r#loop(t: &Thread, n: u64) {}
        );
        let out = expand(&f).unwrap().to_string();
        assert!(out.contains("export_name = \"loop\"") && out.contains("static LOOP"), "{out}");
        let f: syn::ItemFn = syn::parse_quote!(
            pub fn K2(t: &Thread) {}
        );
        assert!(expand(&f).unwrap_err().to_string().contains("needs a lowercase letter"));
    }

    /// Parameters the launch cannot carry are refused by the macro, naming the parameter's problem (the
    /// compiler's errors named the launch tuple's trait bounds or an unsized `DevPtr`).
    #[test]
    fn parameters_the_launch_cannot_carry() {
        let cases: [(syn::ItemFn, &str); 6] = [
            (
                syn::parse_quote!(
                    pub fn k(t: &Thread, a: u64, b: u64, c: u64, d: u64, e: u64, f: u64, g: u64, h: u64, i: u64) {}
                ),
                "at most 8 parameters after `t: &Thread` (it has 9)",
            ),
            (
                syn::parse_quote!(
                    pub fn k(t: &Thread, n: impl Copy) {}
                ),
                "cannot be `impl Trait`",
            ),
            (
                syn::parse_quote!(
                    pub fn k(t: &Thread, xs: &[u64]) {}
                ),
                "cannot be a slice",
            ),
            (
                syn::parse_quote!(
                    pub fn k(t: &Thread, xs: *const [u8]) {}
                ),
                "cannot be a slice",
            ),
            (
                syn::parse_quote!(
                    pub fn k(t: &Thread, s: &str) {}
                ),
                "cannot be a `str`",
            ),
            (
                syn::parse_quote!(
                    pub fn k(t: &Thread, d: &dyn Send) {}
                ),
                "cannot point to a trait object",
            ),
        ];
        for (f, want) in cases {
            let e = expand(&f).map(|_| ()).unwrap_err().to_string();
            assert!(e.contains(want), "{}: {e}", quote::quote!(#f));
        }
        // Eight is the most, and arrays (by value or by reference) are sized.
        let f: syn::ItemFn = syn::parse_quote!(
            pub fn k(t: &Thread, a: u64, b: u64, c: u64, d: u64, e: u64, f: u64, g: &[u64; 4], h: [u32; 2]) {}
        );
        assert!(expand(&f).is_ok());
    }
}
