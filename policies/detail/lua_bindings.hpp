// What scripts see of pdgate, as the VM's lifecycle (lua_vm.cpp) installs
// and pushes it: the `pdgate.*` library (lua_pdgate_lib.cpp), the request
// hook's `req` handle (lua_request_api.cpp), and the tables a pick or
// on_complete is given (lua_context.cpp).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "core/pipeline/client_key.hpp"
#include "policies/detail/lua_state.hpp"

namespace pdgate::policy::detail {

// lua_pdgate_lib.cpp: registers the global `pdgate` table, which every
// script's environment then shares (push_sandbox_env).
void register_pdgate_lib(lua_State* L);
// pdgate.RECHECK, a light userdata only the library hands out: a pick that
// returns it asks to be asked again (PickStatus::recheck).
const void* recheck_token();

// lua_request_api.cpp: creates the metatables of `req` and `req.body`
// (I.req_meta_ref, I.body_meta_ref).
void create_request_metatables(Impl& I);
// Pushes a fresh `req` handle for on_request; it reads I.cur_hook and
// writes I.cur_decision, so it is valid during that call only.
void push_request_handle(Impl& I);

// lua_context.cpp: creates the tables reused from call to call (ctx with
// its metatable, the outcome, the shared empty table).
void create_context_tables(Impl& I);
// Pushes the reused ctx table, emptied of the previous call's fields.
void push_ctx(Impl& I, const PickContext& ctx);
// Pushes the stage's instances array, rebuilding it when the candidate
// list changed and refreshing the numbers that changed since last time.
void push_instances(Impl& I, Stage stage, const std::vector<InstancePtr>& candidates,
                    std::int64_t now_ms);
// Pushes the table of the instance a stage chose, for its on_complete.
void push_chosen_instance(Impl& I, Stage stage, const Instance& chosen);
// Pushes the reused outcome table, filled with `outcome`.
void push_outcome(Impl& I, const PickOutcome& outcome);
// {name = ..., labels = {...}} of the client's API key, or nil.
void push_client_key(lua_State* L, const ClientKey* key);
// ctx.vars / req.vars: the request's table (by PickContext::serial), made
// on first use; drop_vars forgets it (the request's decode was reported).
void push_vars(Impl& I, std::uint64_t serial);
void drop_vars(Impl& I, std::uint64_t serial);
// Adds one header to the table on top of the stack; the callback a
// request's for_each_header is given.
void add_header(void* L, std::string_view name, std::string_view value);

}  // namespace pdgate::policy::detail
