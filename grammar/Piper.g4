// Piper's strategy language: the concrete syntax only. Meaning lives in lang/ (see docs/language.md).
grammar Piper;

file        : stmt* EOF ;

stmt        : 'param' NAME '=' expr ('in' domain)? ';'                    # paramStmt
            | 'let' NAME '=' expr ';'                                     # letStmt
            | 'mesh' (axisDef (',' axisDef)*)? ';'                        # meshStmt
            | 'stream' NAME (',' NAME)* ';'                               # streamStmt
            | 'use' STRING ('(' (binding (',' binding)*)? ')')? ';'       # useStmt
            | 'assert' expr (',' STRING)? ';'                             # assertStmt
            | ifChain                                                     # ifStmt
            | 'for' NAME 'in' expr '..' expr block                        # forStmt
            | 'place' selectors placeTarget streamClause? ';'             # placeStmt
            | 'replicate' selectors 'over' axisRef replicateOpt* streamClause? ';' # replicateStmt
            | 'shard' selectors 'over' axisRef shardDim? (seq='sequence' exchange=NAME?)? streamClause? ';' # shardStmt
            | 'split' 'batch' 'into' expr ';'                             # splitStmt
            | 'mirror' 'over' axisRef ';'                                 # mirrorStmt
            | 'order' chain streamClause? ';'                             # orderStmt
            | 'order' 'from' STRING ';'                                   # orderFromStmt
            | 'sequence' block                                            # sequenceStmt
            | 'recompute' selectors ';'                                   # recomputeStmt
            | 'precision' NAME ('for' selectors)? ';'                     # precisionStmt
            ;

// The values piper-tune searches for a parameter: a list, or a function of constants (divisors(world)).
domain      : '{' expr (',' expr)* '}'                                    # domainList
            | NAME '(' expr ')'                                           # domainCall
            ;
ifChain     : 'if' expr block ('else' (ifChain | block))? ;
block       : '{' stmt* '}' ;
axisDef     : NAME '=' expr ;
binding     : NAME '=' expr ;
axisRef     : NAME ('=' expr)? ;
streamClause: 'on' 'stream' NAME ('sms' expr)? ;                   // sms: multiprocessors its communication may use
shardDim    : NAME ;                                                      // tensor parallelism: heads, hidden

placeTarget : 'over' axisRef placeMode?                                   # placeOver
            | 'on' coord (',' coord)*                                     # placeOn
            ;
placeMode   : 'contiguous'                                                # modeContiguous
            | 'interleaved' '(' expr ')' balance?                         # modeInterleaved
            | 'vshape' balance?                                           # modeVshape
            | 'balanced'                                                  # modeBalanced
            ;
balance     : 'balanced' ;                                                // chunks cut by cost
coord       : NAME '=' expr ;

replicateOpt: 'zero' expr                                                 # zeroOpt
            | 'bucket' expr                                               # bucketOpt
            | 'unit' selectors                                            # unitOpt
            | 'prefetch' expr                                             # prefetchOpt
            ;

selectors   : selector (',' selector)* ;
selector    : '*'                                                         # allSelector
            | pathPart ('.' pathPart)*                                    # pathSelector
            ;
pathPart    : NAME ('[' index ']')? ;
index       : '*'                                                         # indexAll
            | expr '..' expr                                              # indexRange
            | expr                                                        # indexOne
            ;

chain       : group ('->' group)* ;
group       : task ('||' task)* ;
task        : NAME '(' (expr (',' expr)*)? ')' ;

expr        : '(' expr ')'                                                # parenExpr
            | NAME '(' (callArg (',' callArg)*)? ')'                      # callExpr
            | op=('-' | 'not') expr                                       # unaryExpr
            | expr op=('*' | '/' | '%') expr                              # mulExpr
            | expr op=('+' | '-') expr                                    # addExpr
            | expr op=('<' | '<=' | '>' | '>=') expr                      # cmpExpr
            | expr op=('==' | '!=') expr                                  # eqExpr
            | expr 'and' expr                                             # andExpr
            | expr 'or' expr                                              # orExpr
            | INT                                                         # intExpr
            | SIZE                                                        # sizeExpr
            | ('true' | 'false')                                          # boolExpr
            | NAME                                                        # nameExpr
            ;
// len(layers) takes a selector; min/max take expressions. A bare name parses as a selector too.
callArg     : expr | selector ;

SIZE        : [0-9]+ ('KB' | 'MB' | 'GB' | 'KiB' | 'MiB' | 'GiB') ;
INT         : [0-9]+ ;
NAME        : [a-zA-Z_] [a-zA-Z_0-9]* ;
STRING      : '"' ~["\r\n]* '"' ;
COMMENT     : '#' ~[\r\n]* -> channel(HIDDEN) ;
WS          : [ \t\r\n]+ -> skip ;
// The parser never sees these two: the front end reports them in plain words before parsing.
UNTERMINATED: '"' ~["\r\n]* -> channel(HIDDEN) ;
BAD         : . -> channel(HIDDEN) ;
