; codekv anchors shared by C and C++ (compiled after each one's own file): structs, unions,
; enums, typedefs, macros and includes, which the two grammars name alike. Capture names: see
; codekv/grammars/__init__.py.

; -- definitions: structs/unions/enums, typedefs, macros ------------------------------------
(struct_specifier name: (type_identifier) @name body: (_)) @definition.struct
(union_specifier name: (type_identifier) @name body: (_)) @definition.union
(enum_specifier name: (type_identifier) @name body: (_)) @definition.enum
(enumerator name: (identifier) @name) @definition.constant
(type_definition declarator: [
  (type_identifier) @name
  (pointer_declarator declarator: (type_identifier) @name)
  (array_declarator declarator: (type_identifier) @name)
  (function_declarator declarator: (parenthesized_declarator
    (pointer_declarator declarator: (type_identifier) @name)))
]) @definition.type
(preproc_def name: (identifier) @name) @definition.macro
(preproc_function_def name: (identifier) @name) @definition.macro

; -- includes: `#include "x.h"` -> module x.h; `<stdio.h>`, `<vector>` keep their brackets --
(preproc_include path: (string_literal (string_content) @module)) @import
(preproc_include path: (system_lib_string) @module) @import
