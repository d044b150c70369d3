// cuda-agent binding registry (judge-owned; agents must not edit it).
//
// Each kernels/NAME_binding.cpp registers a function that adds its Python entry points to the module:
//
//     static void register_name(pybind11::module& m) { m.def("name_forward", &name_forward); }
//     REGISTER_BINDING(name, register_name);
//
// binding.cpp then defines the single module `cuda_extension` and runs every registered function.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <utility>
#include <vector>

namespace py = pybind11;

namespace cuda_agent {

using BindingFn = void (*)(pybind11::module_&);

// One list per shared object: an inline function's static local is merged across translation units.
inline std::vector<std::pair<const char*, BindingFn>>& registered_bindings() {
    static std::vector<std::pair<const char*, BindingFn>> bindings;
    return bindings;
}

struct BindingRegistrar {
    BindingRegistrar(const char* name, BindingFn fn) { registered_bindings().emplace_back(name, fn); }
};

}  // namespace cuda_agent

#define REGISTER_BINDING(name, fn)                                                   \
    static ::cuda_agent::BindingRegistrar cuda_agent_binding_registrar_##name(      \
        #name, [](pybind11::module_& m) { fn(m); })
