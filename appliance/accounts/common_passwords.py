"""A few hundred of the most commonly used passwords and base words, for the console's password policy.

Written out by hand from the well-known leaked-password rankings (the top of the
lists everyone publishes); ``appliance.accounts.users.password_problem`` also strips digits
and symbols from the ends and undoes common letter swaps before looking a
password up here, so ``P@ssw0rd2024!`` is caught by ``password``.
"""

from __future__ import annotations

_WORDS = """
0000 000000 0123456789 102030 1111 11111 111111 11111111 112233 11223344 112233445566 121212 121314 123123 123123123
123321 1234 12341234 123412341234 12344321 12345 1234554321 123456 1234567 12345678 123456789 1234567890 123456789a
123456a 1234abcd 1234qwer 123654 123789 123abc 123qwe 12qwaszx 131313 147258 147258369 159357 159753 1q2w3e 1q2w3e4r
1q2w3e4r5t 1q2w3e4r5t6y 1qaz2wsx 1qazxsw2 2000 222222 232323 333333 456789 555555 654321 666666 696969 741852963
777777 7777777 789456 789456123 87654321 888888 88888888 963852741 987654 987654321 9876543210 999999 a123456
a12345678 a1b2c3 a1b2c3d4 aa123456 aaaaaa abc123 abc12345 abc123abc abcabc abcd1234 abcdef abcdefg abcdefgh access
adidas admin admin123 admin1234 administrator administrator1 always amanda america andrea andrew android angel angel1
anthony anything apple april army arsenal asdf1234 asdfasdf asdfgh asdfghjkl asdfghjkl1 ashley atari audi august
austin australia autumn2024 avengers azerty azertyuiop babe baby baby123 babygirl backup badboy bailey banana
barcelona barney baseball baseball1 basketball batman batman1 bear bears beatles beautiful berlin bestfriend bigdaddy
bigdick bigdog bitcoin biteme blessed blockchain bmw booboo boomer boston brandon brandy brazil bulldog business
buster butterfly california camaro canada candy cash casper champion champions changeme changeme123 charles charlie
cheese chelsea chelsea1 chester chicago chicken china chocolate chris christ cisco cobra cocacola coffee college
company compaq computer computer1 confidential contrasena cookie cookie1 corvette cowboy cowboys crypto crystal
cupcake cyber daddy dakota dallas dancer daniel darling database debian december default default123 desktop destiny
diablo diamond director doctor dollar dolphin dragon dragon1 dragonball dragons drummer ducati eagle eagles edward
elvis eminem england enter eternity ethereum everything facebook falcon falcon1 fall2024 family february fender
ferrari ferrari1 firewall fishing florida flower flowers football football1 forever forever1 fortnite france freedom
friday friend friends frodo fuckoff fuckyou gamer gaming gandalf gandalf1 gateway george germany gfhjkm ghbdtn ginger
gladiator god godisgood golf golf1 golfer google griffin guest guitar guitar1 hacker hacking hallo hammer handsome
hannah hardcore harley harley1 haslo hawk heather heaven heaven1 hello hello123 hellokitty hobbit hockey hockey1 honda
honey hottie hunter hunter1 iceman ihateyou iloveyou iloveyou1 iloveyou123 iloveyou2 india infinity instagram internet
iphone ironman italy jackie jackson jaguar james january japan jasmine jasper jennifer jessica jesus jesus1 johnny
jordan joseph joshua july june junior justin juventus kawasaki keyboard killer killer1 klaster knight lakers laptop
legend legends letmein letmein1 letmein123 linkedin linux lion liverpool login london love lovelove lovely loveme
lovers luigi madrid maggie manager manchester march marina marine marine1 mario marlboro martin marvel master matrix
matrix1 matthew maverick may mazda melissa mercedes mercedes1 merlin merlin1 metallica mexico michael michelle mickey
microsoft midnight military miller minecraft mobilemail modem mom mommy monday money money1 monitor monitor1
monitoring monkey monster montana moon mordor morgan moscow motdepasse mother mouse music musician mustang mypass
mypassword mysql naruto nascar natasha navy ncc1701 network newpassword newyork nicole nikita ninja nintendo nirvana
nissan nopassword nothing november nurse october office oldpassword oliver opensesame openup oracle orange p@ssw0rd
p@ssword pacman panther panties paris parola pass pass123 pass1234 passpass passw0rd password password1 password12
password123 password1234 passwort patrick peanut pepper phoenix phoenix1 piano pikachu player player1 playstation
please pokemon police porsche porsche1 postgres pretty prince princess princess1 printer private purple python
q1w2e3r4 q1w2e3r4t5 qazwsx qazwsxedc qwer1234 qwerty qwerty1 qwerty12 qwerty123 qwerty1234 qwerty7 qwertyu qwertyui
qwertyuiop qwertyuiop1 qwertz qwertzuiop rabbit racer rachel racing raiders rainbow ranger rangers realmadrid redsox
richard robert roblox rocknroll rockstar root root123 router russia salasana samantha samsung samurai saturday sauron
school scooby scooter secret secret123 secretpassword security senha september server sexy shadow shark sharks sheriff
shogun silver singer skate skater slayer slipknot smokey snake sniper snoopy snowboard soccer soccer1 soldier
something sonic spain sparky spartan speed spider spiderman spring2024 startrek starwars starwars1 steelers steven
student subaru success sugar summer summer2023 summer2024 sunday sunflower sunshine superman superman1 supersecret
surfer suzuki sweet sweetheart system taylor teacher tennis tennis1 test test123 test1234 testing tetris texas thomas
thunder thursday tiger tigers tigger together tokyo toor topsecret toyota trinity trustno1 tuesday turbo twitter
ubuntu unicorn university user victoria viking viper volkswagen wachtwoord warrior wednesday welcome welcome1
welcome123 welcome2 whatever whatever1 wifi william windows winner winner1 winter winter2024 wireless wizard wizard1
wolf wolves xbox xxxxxx yamaha yamaha1 yankees yellow yourpassword youshallnotpass youtube zaq12wsx zaq1zaq1 zelda
zxcvbn zxcvbnm zxcvbnm1 zxcvbnm123
"""

COMMON_PASSWORDS: frozenset[str] = frozenset(_WORDS.split())
